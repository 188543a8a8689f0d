//! Wan schedulers against diffusers (`scripts/gen_wan_scheduler_fixtures.py`): UniPC and
//! Euler timesteps and sigmas for several (steps, shift) pairs, 6-step trajectories on fixed
//! random model outputs (several UniPC variants), the A14B expert split, config parsing and
//! input errors.

use candle_core::{DType, Device, Tensor};
use mxattn_wan::scheduler::{
    expert_of_step, expert_switch_step, EulerConfig, FlowEulerScheduler, FlowScheduler,
    SamplerKind, SigmaSpacing, UniPcConfig, UniPcScheduler,
};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

mod common;
use common::max_abs_diff;

const DEV: Device = Device::Cpu;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan/scheduler")
}

fn expected() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixtures().join("expected.safetensors"), &DEV).unwrap()
}

fn meta() -> Value {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn config_json() -> Value {
    let text = std::fs::read_to_string(fixtures().join("scheduler_config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap()
}

/// The repo config with `kwargs` (scheduler kwargs of a trajectory) on top.
fn unipc_config(kwargs: &Value) -> UniPcConfig {
    let mut v = config_json();
    for (k, x) in kwargs.as_object().unwrap() {
        v[k] = x.clone();
    }
    UniPcConfig::from_json(&v.to_string()).unwrap()
}

fn check_schedule(name: &str, s: &dyn FlowScheduler, ts: &Tensor, sigmas: &Tensor) {
    assert_eq!(s.timesteps(), f64s(ts).as_slice(), "{name}: timesteps");
    let want = f32s(sigmas);
    assert_eq!(s.sigmas().len(), want.len(), "{name}: sigma count");
    for (i, (a, b)) in s.sigmas().iter().zip(&want).enumerate() {
        assert!((a - b).abs() <= 1e-6, "{name}: sigma {i}: {a} vs {b}");
    }
}

#[test]
fn repo_config_parses() {
    let c = UniPcConfig::from_file(fixtures().join("scheduler_config.json")).unwrap();
    assert_eq!(c, UniPcConfig::wan(3.0));
    assert_eq!(c.flow_shift, 3.0);
    assert_eq!(c.solver_order, 2);
    assert_eq!(c.solver_type, "bh2");
    assert!(c.use_flow_sigmas && c.lower_order_final && c.predict_x0);
    assert!(c.disable_corrector.is_empty());
    // a repo directory without the file names the path it looked for
    let e = UniPcConfig::from_repo(fixtures()).unwrap_err().to_string();
    assert!(e.contains("scheduler_config.json"), "{e}");
}

#[test]
fn schedules_match_diffusers() {
    let exp = expected();
    let meta = meta();
    let names = meta["schedules"].as_array().unwrap();
    assert!(names.len() >= 4);
    for key in names {
        let key = key.as_str().unwrap();
        // "n40_s12"
        let (n, s) = key[1..].split_once("_s").unwrap();
        let (n, shift): (usize, f64) = (n.parse().unwrap(), s.parse().unwrap());
        let mut u = UniPcScheduler::new(UniPcConfig::wan(shift)).unwrap();
        u.set_timesteps(n).unwrap();
        check_schedule(
            &format!("unipc {key}"),
            &u,
            &exp[&format!("unipc.{key}.timesteps")],
            &exp[&format!("unipc.{key}.sigmas")],
        );
        let mut e = FlowEulerScheduler::new(EulerConfig {
            num_train_timesteps: 1000,
            shift,
        })
        .unwrap();
        e.set_timesteps(n).unwrap();
        check_schedule(
            &format!("euler {key}"),
            &e,
            &exp[&format!("euler.{key}.timesteps")],
            &exp[&format!("euler.{key}.sigmas")],
        );
    }
}

#[test]
fn trajectories_match_diffusers() {
    let exp = expected();
    let meta = meta();
    let trajs = meta["trajectories"].as_object().unwrap();
    assert!(trajs.len() >= 6);
    for (name, t) in trajs {
        let kwargs = &t["kwargs"];
        let mut s: Box<dyn FlowScheduler> = match t["kind"].as_str().unwrap() {
            "unipc" => Box::new(UniPcScheduler::new(unipc_config(kwargs)).unwrap()),
            "euler" => Box::new(
                FlowEulerScheduler::new(EulerConfig {
                    num_train_timesteps: 1000,
                    shift: kwargs["shift"].as_f64().unwrap(),
                })
                .unwrap(),
            ),
            k => panic!("kind {k}"),
        };
        let outputs = &exp[&format!("{name}.outputs")];
        let samples = &exp[&format!("{name}.samples")];
        let steps = outputs.dim(0).unwrap();
        s.set_timesteps(steps).unwrap();
        check_schedule(
            name,
            s.as_ref(),
            &exp[&format!("{name}.timesteps")],
            &exp[&format!("{name}.sigmas")],
        );
        let mut x = exp[&format!("{name}.sample0")].clone();
        for i in 0..steps {
            x = s.step(&outputs.get(i).unwrap(), i, &x).unwrap();
            assert_eq!(x.dtype(), DType::F32);
            let want = samples.get(i).unwrap();
            let d = max_abs_diff(&x, &want);
            assert!(d <= 1e-5, "{name}: step {i}: max |diff| {d}");
        }
        // the trajectory moved: a port that skipped the corrector or the second order would not
        // land within 1e-5 of every sample
        let moved = max_abs_diff(&x, &exp[&format!("{name}.sample0")]);
        assert!(moved > 0.1, "{name}: trajectory barely moved ({moved})");
    }
}

/// The corrector and the second-order predictor both matter at the tolerance used above.
#[test]
fn trajectory_tolerance_is_discriminating() {
    let exp = expected();
    let meta = meta();
    let name = "unipc_s5";
    let outputs = &exp[&format!("{name}.outputs")];
    let samples = &exp[&format!("{name}.samples")];
    for variant in [
        serde_json::json!({"flow_shift": 5.0, "solver_order": 1}),
        serde_json::json!({"flow_shift": 5.0, "disable_corrector": [1]}),
        serde_json::json!({"flow_shift": 5.0, "solver_type": "bh1"}),
    ] {
        let mut s = UniPcScheduler::new(unipc_config(&variant)).unwrap();
        s.set_timesteps(6).unwrap();
        let mut x = exp[&format!("{name}.sample0")].clone();
        let mut worst = 0f32;
        for i in 0..6 {
            x = s.step(&outputs.get(i).unwrap(), i, &x).unwrap();
            worst = worst.max(max_abs_diff(&x, &samples.get(i).unwrap()));
        }
        assert!(worst > 1e-3, "{variant}: differs only by {worst}");
    }
    assert_eq!(meta["trajectories"][name]["kwargs"]["flow_shift"], 5.0);
}

#[test]
fn expert_split_matches_pipeline_rule() {
    let meta = meta();
    let splits = meta["splits"].as_array().unwrap();
    for sp in splits {
        let steps = sp["steps"].as_u64().unwrap() as usize;
        let shift = sp["shift"].as_f64().unwrap();
        let ratio = sp["boundary_ratio"].as_f64().unwrap();
        let high = sp["high"].as_u64().unwrap() as usize;
        let mut u = UniPcScheduler::new(UniPcConfig::wan(shift)).unwrap();
        u.set_timesteps(steps).unwrap();
        let sw = expert_switch_step(u.timesteps(), ratio, 1000).unwrap();
        assert_eq!(sw, high, "{sp}");
        assert_eq!(expert_of_step(sw.saturating_sub(1), sw), 0);
        assert_eq!(expert_of_step(sw, sw), 1);
    }
    // T2V-A14B with the original's sampler settings: 40 steps, shift 12, boundary 0.875
    let mut u = UniPcScheduler::new(UniPcConfig::wan(12.0)).unwrap();
    u.set_timesteps(40).unwrap();
    assert_eq!(expert_switch_step(u.timesteps(), 0.875, 1000).unwrap(), 26);
    // the diffusers defaults (50 steps, shift 3.0) split 16 / 34 with diffusers' sigmas
    let mut u = UniPcScheduler::new(UniPcConfig::wan(3.0)).unwrap();
    u.set_timesteps(50).unwrap();
    assert_eq!(expert_switch_step(u.timesteps(), 0.875, 1000).unwrap(), 16);
    assert_eq!(expert_switch_step(u.timesteps(), 0.0, 1000).unwrap(), 50);
    assert_eq!(expert_switch_step(u.timesteps(), 1.0, 1000).unwrap(), 0);
    assert!(expert_switch_step(u.timesteps(), 1.5, 1000).is_err());
    assert!(expert_switch_step(u.timesteps(), f64::NAN, 1000).is_err());
}

/// The original Wan2.2 scheduler (`wan/utils/fm_solvers_unipc.py`, fixtures from
/// `--wan-repo`): its `linspace(0.999, 0, n+1)[:-1]` spacing, its trajectory, and the splits of
/// models.md §A5 (26/14, 15/25, 15/35), which that spacing gives.
#[test]
fn wan_original_scheduler() {
    let exp =
        candle_core::safetensors::load(fixtures().join("wan_original.safetensors"), &DEV).unwrap();
    let original = |shift: f64| {
        let mut c = UniPcConfig::wan(shift);
        c.sigma_spacing = SigmaSpacing::WanOriginal;
        UniPcScheduler::new(c).unwrap()
    };
    for key in meta()["schedules"].as_array().unwrap() {
        let key = key.as_str().unwrap();
        let (n, s) = key[1..].split_once("_s").unwrap();
        let mut u = original(s.parse().unwrap());
        u.set_timesteps(n.parse().unwrap()).unwrap();
        check_schedule(
            &format!("original {key}"),
            &u,
            &exp[&format!("{key}.timesteps")],
            &exp[&format!("{key}.sigmas")],
        );
    }
    let outputs = &exp["traj.outputs"];
    let samples = &exp["traj.samples"];
    let mut u = original(12.0);
    u.set_timesteps(6).unwrap();
    let mut x = exp["traj.sample0"].clone();
    for i in 0..6 {
        x = u.step(&outputs.get(i).unwrap(), i, &x).unwrap();
        let d = max_abs_diff(&x, &samples.get(i).unwrap());
        assert!(d <= 1e-5, "original: step {i}: max |diff| {d}");
    }
    for (steps, shift, ratio, high) in [
        (40, 12.0, 0.875, 26),
        (40, 5.0, 0.9, 15),
        (50, 3.0, 0.875, 15),
    ] {
        let mut u = original(shift);
        u.set_timesteps(steps).unwrap();
        assert_eq!(
            expert_switch_step(u.timesteps(), ratio, 1000).unwrap(),
            high,
            "{steps} steps, shift {shift}"
        );
    }
}

#[test]
fn config_errors() {
    let base = config_json();
    for (key, value, needle) in [
        (
            "_class_name",
            serde_json::json!("DDIMScheduler"),
            "_class_name",
        ),
        (
            "prediction_type",
            serde_json::json!("epsilon"),
            "prediction_type",
        ),
        (
            "use_flow_sigmas",
            serde_json::json!(false),
            "use_flow_sigmas",
        ),
        (
            "use_karras_sigmas",
            serde_json::json!(true),
            "use_karras_sigmas",
        ),
        ("solver_type", serde_json::json!("bh3"), "solver_type"),
        (
            "final_sigmas_type",
            serde_json::json!("one"),
            "final_sigmas_type",
        ),
        ("solver_order", serde_json::json!(0), "solver_order"),
        ("flow_shift", serde_json::json!(-1.0), "flow_shift"),
        (
            "flow_shift",
            serde_json::json!("x"),
            "not a UniPCMultistepScheduler config",
        ),
    ] {
        let mut v = base.clone();
        v[key] = value;
        let e = UniPcConfig::from_json(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{key}: {e}");
    }
    let e = UniPcConfig::from_file(fixtures().join("missing.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.json"), "{e}");
    // no fields at all: diffusers' defaults, which are not a flow scheduler
    assert!(UniPcConfig::from_json("{}").is_err());
    assert!(SamplerKind::parse("ddim").is_err());
    assert_eq!(SamplerKind::parse("UniPC").unwrap(), SamplerKind::UniPc);
    assert!(FlowEulerScheduler::new(EulerConfig {
        num_train_timesteps: 1000,
        shift: 0.0
    })
    .is_err());
}

#[test]
fn step_errors() {
    let x = Tensor::zeros((1, 4, 2, 3, 3), DType::F32, &DEV).unwrap();
    for kind in [SamplerKind::UniPc, SamplerKind::Euler] {
        let mut s = kind.build(&UniPcConfig::wan(5.0)).unwrap();
        let e = s.step(&x, 0, &x).unwrap_err().to_string();
        assert!(e.contains("set_timesteps"), "{e}");
        assert!(s.set_timesteps(0).is_err());
        s.set_timesteps(3).unwrap();
        assert_eq!(s.timesteps().len(), 3);
        assert_eq!(s.sigmas().len(), 4);
        let e = s.step(&x, 1, &x).unwrap_err().to_string();
        assert!(e.contains("in order"), "{e}");
        let wrong = Tensor::zeros((1, 4, 2, 3, 2), DType::F32, &DEV).unwrap();
        let e = s.step(&wrong, 0, &x).unwrap_err().to_string();
        assert!(e.contains("shape"), "{e}");
        let ints = Tensor::zeros((1, 4, 2, 3, 3), DType::U32, &DEV).unwrap();
        assert!(s.step(&ints, 0, &x).is_err());
        for i in 0..3 {
            s.step(&x, i, &x).unwrap();
        }
        let e = s.step(&x, 3, &x).unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
        // set_timesteps restarts
        s.set_timesteps(3).unwrap();
        s.step(&x, 0, &x).unwrap();
    }
}

/// A bf16 sample comes back in bf16; the velocity of a zero-noise sample is followed exactly.
#[test]
fn dtypes_and_straight_line() {
    // x_t = (1 − σ)·x0 + σ·ε and v = ε − x0: every sampler must land on x0
    let x0 = Tensor::new(&[[0.5f32, -1.0, 2.0]], &DEV).unwrap();
    let eps = Tensor::new(&[[-0.3f32, 0.7, 1.1]], &DEV).unwrap();
    let v = (&eps - &x0).unwrap();
    for kind in [SamplerKind::UniPc, SamplerKind::Euler] {
        let mut s = kind.build(&UniPcConfig::wan(5.0)).unwrap();
        s.set_timesteps(8).unwrap();
        let s0 = s.sigmas()[0] as f64;
        let mut x = ((x0.affine(1.0 - s0, 0.0).unwrap()) + eps.affine(s0, 0.0).unwrap()).unwrap();
        for i in 0..8 {
            x = s.step(&v, i, &x).unwrap();
        }
        let d = max_abs_diff(&x, &x0);
        assert!(d < 1e-5, "{kind:?}: {d}");
        s.set_timesteps(2).unwrap();
        let xb = x.to_dtype(DType::BF16).unwrap();
        let y = s.step(&v.to_dtype(DType::BF16).unwrap(), 0, &xb).unwrap();
        assert_eq!(y.dtype(), DType::BF16);
    }
}
