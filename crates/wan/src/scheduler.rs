//! Flow-matching schedulers of the Wan2.x pipelines, matching diffusers.
//!
//! * [`UniPcScheduler`]: diffusers' `UniPCMultistepScheduler` with flow sigmas, the sampler of
//!   every Wan2.x diffusers repo (`scheduler/scheduler_config.json`: `flow_prediction`,
//!   `use_flow_sigmas`, order 2, `bh2`, `predict_x0`, `lower_order_final`, final sigma zero).
//! * [`FlowEulerScheduler`]: diffusers' `FlowMatchEulerDiscreteScheduler` with the same shift.
//!
//! The model predicts the velocity `v`; the data estimate is `x0 = x − σ·v`.
//!
//! **Sigmas.** diffusers spaces `σ = linspace(1, 1/N, n+1)[:-1]` (N = 1000 training steps),
//! shifts it, `σ' = s·σ / (1 + (s−1)·σ)`, nudges a first σ' of 1 to `1 − 1e-6`, and hands
//! the transformer `t = trunc(σ'·N)`. The original Wan code (`wan/utils/fm_solvers_unipc.py`)
//! spaces `linspace(0.999, 0, n+1)[:-1]` instead, so its timesteps differ slightly for the same
//! (steps, shift), and so can the A14B expert split ([`expert_switch_step`]: 50 steps at shift
//! 3.0 with boundary 0.875 split 16 / 34 with diffusers' sigmas, 15 / 35 with the original's);
//! [`SigmaSpacing::WanOriginal`] reproduces the original. The solver is the same.
//!
//! The diffusers converter writes `flow_shift` 3.0 into the A14B repos (5.0 for TI2V) where
//! the original T2V uses 12.0; set it with [`UniPcConfig::flow_shift`].
//!
//! **Precision.** Sigmas are stored in f32 as diffusers does and the step coefficients are
//! computed in f64 from them (diffusers uses f32 scalars; the difference is far below the f32
//! rounding of the sample). Samples are updated in f32 and returned in the sample's dtype. As
//! in diffusers, `σ·v` is rounded to the model output's dtype before it is subtracted (a bf16
//! transformer's velocity stays bf16 until then).

use candle_core::{bail, DType, Result, Tensor};
use serde::Deserialize;
use std::path::Path;

/// The common interface of the samplers.
pub trait FlowScheduler: Send {
    /// Sets `n` inference steps and resets the multistep state.
    fn set_timesteps(&mut self, n: usize) -> Result<()>;
    /// The timestep of each step, as the transformer receives it (integers for UniPC,
    /// f32 values for Euler, as diffusers).
    fn timesteps(&self) -> &[f64];
    /// The noise level of each step, plus the final one: `n + 1` values.
    fn sigmas(&self) -> &[f32];
    /// Advances `sample` from step `step`'s sigma to the next one, given the model output
    /// (the velocity) at that step. Steps must run in order, from 0.
    fn step(&mut self, model_output: &Tensor, step: usize, sample: &Tensor) -> Result<Tensor>;
    /// `num_train_timesteps` of the config (1000 for Wan).
    fn num_train_timesteps(&self) -> usize;
}

/// The UniPC solver variant (the `B(h)` function).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SolverType {
    /// `B(h) = h`.
    Bh1,
    /// `B(h) = e^h − 1` (Wan).
    Bh2,
}

/// The sigma after the last step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinalSigmas {
    /// 0: the last step lands on the data estimate (Wan).
    Zero,
    /// The last step's own sigma.
    SigmaMin,
}

/// How the sigmas are spaced before the shift.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SigmaSpacing {
    /// diffusers: `linspace(1, 1/N, n+1)[:-1]`, a first σ of 1 nudged to `1 − 1e-6`.
    #[default]
    Diffusers,
    /// The original Wan code: `linspace(0.999, 0, n+1)[:-1]` (not in any config file).
    WanOriginal,
}

/// `scheduler/scheduler_config.json` of a diffusers Wan repo (`UniPCMultistepScheduler`).
///
/// Missing fields take diffusers' class defaults, not Wan's: a file without
/// `"use_flow_sigmas": true` is not a flow-matching scheduler and is rejected by
/// [`UniPcConfig::validate`]. [`UniPcConfig::wan`] gives Wan's values.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct UniPcConfig {
    #[serde(rename = "_class_name")]
    pub class_name: Option<String>,
    pub num_train_timesteps: usize,
    pub solver_order: usize,
    pub prediction_type: String,
    pub predict_x0: bool,
    pub solver_type: String,
    pub lower_order_final: bool,
    /// Steps (0-based) whose following corrector is skipped.
    pub disable_corrector: Vec<usize>,
    pub use_flow_sigmas: bool,
    pub flow_shift: f64,
    pub final_sigmas_type: String,
    pub thresholding: bool,
    pub use_karras_sigmas: bool,
    pub use_exponential_sigmas: bool,
    pub use_beta_sigmas: bool,
    pub use_dynamic_shifting: bool,
    pub shift_terminal: Option<f64>,
    pub solver_p: Option<serde_json::Value>,
    /// Not a diffusers field: [`SigmaSpacing::WanOriginal`] reproduces the original code.
    #[serde(skip)]
    pub sigma_spacing: SigmaSpacing,
}

impl Default for UniPcConfig {
    /// diffusers' class defaults (not a flow scheduler; see [`UniPcConfig::wan`]).
    fn default() -> Self {
        Self {
            class_name: None,
            num_train_timesteps: 1000,
            solver_order: 2,
            prediction_type: "epsilon".into(),
            predict_x0: true,
            solver_type: "bh2".into(),
            lower_order_final: true,
            disable_corrector: Vec::new(),
            use_flow_sigmas: false,
            flow_shift: 1.0,
            final_sigmas_type: "zero".into(),
            thresholding: false,
            use_karras_sigmas: false,
            use_exponential_sigmas: false,
            use_beta_sigmas: false,
            use_dynamic_shifting: false,
            shift_terminal: None,
            solver_p: None,
            sigma_spacing: SigmaSpacing::Diffusers,
        }
    }
}

impl UniPcConfig {
    /// What the diffusers converter writes for Wan, with the given shift (3.0 for the A14B
    /// repos, 5.0 for TI2V-5B; the original T2V-A14B samples with 12.0).
    pub fn wan(flow_shift: f64) -> Self {
        Self {
            class_name: Some("UniPCMultistepScheduler".into()),
            prediction_type: "flow_prediction".into(),
            use_flow_sigmas: true,
            flow_shift,
            ..Self::default()
        }
    }

    /// Reads and checks a `scheduler_config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::from_json(&mxattn_checkpoint::read_text(path)?)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))
    }

    /// Reads `scheduler/scheduler_config.json` of a diffusers repo directory.
    pub fn from_repo(dir: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(dir.as_ref().join("scheduler").join("scheduler_config.json"))
    }

    /// Parses and checks the JSON text of a `scheduler_config.json`.
    pub fn from_json(text: &str) -> Result<Self> {
        let cfg: Self = serde_json::from_str(text).map_err(|e| {
            candle_core::Error::Msg(format!("not a UniPCMultistepScheduler config: {e}"))
        })?;
        cfg.validate().map_err(candle_core::Error::Msg)?;
        Ok(cfg)
    }

    /// The solver variant; diffusers maps the legacy names `midpoint`, `heun` and `logrho` to
    /// `bh2`.
    pub fn solver(&self) -> std::result::Result<SolverType, String> {
        match self.solver_type.as_str() {
            "bh1" => Ok(SolverType::Bh1),
            "bh2" | "midpoint" | "heun" | "logrho" => Ok(SolverType::Bh2),
            s => Err(format!("solver_type {s:?} is not one of bh1, bh2")),
        }
    }

    /// The final sigma rule.
    pub fn final_sigmas(&self) -> std::result::Result<FinalSigmas, String> {
        match self.final_sigmas_type.as_str() {
            "zero" => Ok(FinalSigmas::Zero),
            "sigma_min" => Ok(FinalSigmas::SigmaMin),
            s => Err(format!(
                "final_sigmas_type {s:?} is not one of zero, sigma_min"
            )),
        }
    }

    /// Checks that this is a flow-matching UniPC config this port implements.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if let Some(c) = &self.class_name {
            if c != "UniPCMultistepScheduler" {
                return Err(format!(
                    "_class_name is {c:?}, expected \"UniPCMultistepScheduler\""
                ));
            }
        }
        if self.prediction_type != "flow_prediction" {
            return Err(format!(
                "prediction_type {:?} is not supported (Wan uses \"flow_prediction\")",
                self.prediction_type
            ));
        }
        if !self.use_flow_sigmas {
            return Err("use_flow_sigmas is false; only flow sigmas are supported".into());
        }
        if !self.predict_x0 {
            return Err("predict_x0 false does not go with flow_prediction".into());
        }
        if self.num_train_timesteps == 0 {
            return Err("num_train_timesteps is 0".into());
        }
        if !(1..=8).contains(&self.solver_order) {
            return Err(format!(
                "solver_order {} is not in 1..=8",
                self.solver_order
            ));
        }
        if !(self.flow_shift.is_finite() && self.flow_shift > 0.0) {
            return Err(format!("flow_shift {} must be positive", self.flow_shift));
        }
        for (on, what) in [
            (self.thresholding, "thresholding"),
            (self.use_karras_sigmas, "use_karras_sigmas"),
            (self.use_exponential_sigmas, "use_exponential_sigmas"),
            (self.use_beta_sigmas, "use_beta_sigmas"),
            (self.use_dynamic_shifting, "use_dynamic_shifting"),
            (
                self.shift_terminal.is_some_and(|s| s != 0.0),
                "shift_terminal",
            ),
            (
                self.solver_p.as_ref().is_some_and(|v| !v.is_null()),
                "solver_p",
            ),
        ] {
            if on {
                return Err(format!("{what} is not supported"));
            }
        }
        self.solver()?;
        self.final_sigmas()?;
        Ok(())
    }
}

/// numpy's `linspace(start, stop, num)` (endpoint included), element for element.
fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num == 1 {
        return vec![start];
    }
    let step = (stop - start) / (num - 1) as f64;
    let mut v: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    if let Some(last) = v.last_mut() {
        *last = stop;
    }
    v
}

/// The shift `s·σ / (1 + (s−1)·σ)`, in numpy's operation order.
fn shift_sigma(s: f64, sigma: f64) -> f64 {
    s * sigma / (1.0 + (s - 1.0) * sigma)
}

/// `ln α − ln σ` of a flow sigma (α = 1 − σ).
fn lambda(sigma: f32) -> f64 {
    let s = sigma as f64;
    (1.0 - s).ln() - s.ln()
}

/// Solves the small dense system `a x = b` (Gaussian elimination, partial pivoting).
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Vec<f64> {
    let n = b.len();
    for c in 0..n {
        let p = (c..n)
            .max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))
            .unwrap_or(c);
        a.swap(c, p);
        b.swap(c, p);
        for r in c + 1..n {
            let f = a[r][c] / a[c][c];
            let (top, bottom) = a.split_at_mut(r);
            for (x, p) in bottom[0][c..].iter_mut().zip(&top[c][c..]) {
                *x -= f * p;
            }
            b[r] -= f * b[c];
        }
    }
    let mut x = vec![0.0; n];
    for r in (0..n).rev() {
        let s: f64 = (r + 1..n).map(|k| a[r][k] * x[k]).sum();
        x[r] = (b[r] - s) / a[r][r];
    }
    x
}

/// A multistep sampler's steps run in order from 0, after `set_timesteps`.
fn check_step_order(who: &str, n: usize, step: usize, next: usize) -> Result<()> {
    if n == 0 {
        bail!("{who}: call set_timesteps before step");
    }
    if step >= n {
        bail!("{who}: step {step} is out of range ({n} steps)");
    }
    if step != next {
        bail!(
            "{who}: steps must run in order (expected step {next}, got {step}); call set_timesteps to restart"
        );
    }
    Ok(())
}

fn check_step_inputs(model_output: &Tensor, sample: &Tensor) -> Result<()> {
    if model_output.dims() != sample.dims() {
        bail!(
            "scheduler step: model output shape {:?} differs from the sample's {:?}",
            model_output.dims(),
            sample.dims()
        );
    }
    for (t, what) in [(model_output, "model output"), (sample, "sample")] {
        if !t.dtype().is_float() {
            bail!(
                "scheduler step: the {what} has dtype {:?}, expected a float type",
                t.dtype()
            );
        }
    }
    Ok(())
}

/// `x − σ·v`, with `σ·v` rounded to `v`'s dtype first (as torch does with a 0-d f32 sigma),
/// in f32.
fn data_estimate(sample: &Tensor, v: &Tensor, sigma: f32) -> Result<Tensor> {
    let sv = v.affine(sigma as f64, 0.0)?.to_dtype(DType::F32)?;
    sample.to_dtype(DType::F32)? - sv
}

/// diffusers' `UniPCMultistepScheduler` for flow matching (UniP predictor, UniC corrector).
#[derive(Clone, Debug)]
pub struct UniPcScheduler {
    config: UniPcConfig,
    solver: SolverType,
    final_sigmas: FinalSigmas,
    timesteps: Vec<f64>,
    sigmas: Vec<f32>,
    /// Data estimates of the last `solver_order` steps, oldest first.
    history: Vec<Tensor>,
    lower_order_nums: usize,
    this_order: usize,
    last_sample: Option<Tensor>,
    next_step: usize,
}

impl UniPcScheduler {
    /// A scheduler for `config` (checked). Call [`FlowScheduler::set_timesteps`] before
    /// stepping.
    pub fn new(config: UniPcConfig) -> Result<Self> {
        config.validate().map_err(candle_core::Error::Msg)?;
        let solver = config.solver().map_err(candle_core::Error::Msg)?;
        let final_sigmas = config.final_sigmas().map_err(candle_core::Error::Msg)?;
        Ok(Self {
            config,
            solver,
            final_sigmas,
            timesteps: Vec::new(),
            sigmas: Vec::new(),
            history: Vec::new(),
            lower_order_nums: 0,
            this_order: 0,
            last_sample: None,
            next_step: 0,
        })
    }

    pub fn config(&self) -> &UniPcConfig {
        &self.config
    }

    /// The coefficients shared by the predictor and the corrector for a step from sigma
    /// index `s0` to `t`, with older estimates at sigma indices `prev` (newest first); the
    /// order is `prev.len() + 1`.
    fn coefficients(&self, t: usize, s0: usize, prev: &[usize]) -> Coeffs {
        let (sig_t, sig_s0) = (self.sigmas[t], self.sigmas[s0]);
        let (l_t, l_s0) = (lambda(sig_t), lambda(sig_s0));
        let h = l_t - l_s0;
        let mut rks: Vec<f64> = prev
            .iter()
            .map(|&si| (lambda(self.sigmas[si]) - l_s0) / h)
            .collect();
        rks.push(1.0);
        let hh = -h; // predict_x0
        let h_phi_1 = hh.exp_m1();
        let b_h = match self.solver {
            SolverType::Bh1 => hh,
            SolverType::Bh2 => hh.exp_m1(),
        };
        let order = rks.len();
        let mut h_phi_k = h_phi_1 / hh - 1.0;
        let mut factorial = 1.0;
        let mut b = Vec::with_capacity(order);
        let mut r = Vec::with_capacity(order);
        for i in 1..=order {
            r.push(
                rks.iter()
                    .map(|rk| rk.powi(i as i32 - 1))
                    .collect::<Vec<f64>>(),
            );
            b.push(h_phi_k * factorial / b_h);
            factorial *= (i + 1) as f64;
            h_phi_k = h_phi_k / hh - 1.0 / factorial;
        }
        let sigma_ratio = sig_t as f64 / sig_s0 as f64;
        let alpha_t = 1.0 - sig_t as f64;
        Coeffs {
            rks,
            r,
            b,
            // x_t_ = (σ_t/σ_s0)·x − α_t·hφ₁·m0; x_t = x_t_ − α_t·B(h)·res
            c_x: sigma_ratio,
            c_m0: alpha_t * h_phi_1,
            c_res: alpha_t * b_h,
        }
    }

    /// `Σ_k rhos[k]·(m_k − m0)/r_k` over the older estimates `ms` (newest first).
    fn weighted_diffs(
        ms: &[&Tensor],
        m0: &Tensor,
        rks: &[f64],
        rhos: &[f64],
    ) -> Result<Option<Tensor>> {
        let mut acc: Option<Tensor> = None;
        for ((m, rk), rho) in ms.iter().zip(rks).zip(rhos) {
            let d = ((*m - m0)? / *rk)?;
            let term = d.affine(*rho, 0.0)?;
            acc = Some(match acc {
                None => term,
                Some(a) => (a + term)?,
            });
        }
        Ok(acc)
    }

    /// The UniP predictor from step `k` (sample `x`) to `k + 1`.
    fn predict(&self, k: usize, x: &Tensor, order: usize) -> Result<Tensor> {
        let n_hist = self.history.len();
        let m0 = &self.history[n_hist - 1];
        let prev: Vec<usize> = (1..order).map(|i| k - i).collect();
        let ms: Vec<&Tensor> = (1..order).map(|i| &self.history[n_hist - 1 - i]).collect();
        let c = self.coefficients(k + 1, k, &prev);
        let x_t_ = (x.affine(c.c_x, 0.0)? - m0.affine(c.c_m0, 0.0)?)?;
        if order == 1 {
            return Ok(x_t_);
        }
        let rhos = if order == 2 {
            vec![0.5]
        } else {
            let m = order - 1;
            let a = c.r[..m].iter().map(|row| row[..m].to_vec()).collect();
            solve(a, c.b[..m].to_vec())
        };
        match Self::weighted_diffs(&ms, m0, &c.rks, &rhos)? {
            Some(res) => x_t_ - res.affine(c.c_res, 0.0)?,
            None => Ok(x_t_),
        }
    }

    /// The UniC corrector of the sample `x_t` at step `k`, predicted from `last` at `k − 1`,
    /// given the new data estimate `model_t`. `history` does not yet hold `model_t`.
    fn correct(&self, k: usize, last: &Tensor, model_t: &Tensor, order: usize) -> Result<Tensor> {
        let n_hist = self.history.len();
        let m0 = &self.history[n_hist - 1];
        let prev: Vec<usize> = (1..order).map(|i| k - (i + 1)).collect();
        let ms: Vec<&Tensor> = (1..order).map(|i| &self.history[n_hist - 1 - i]).collect();
        let c = self.coefficients(k, k - 1, &prev);
        let rhos = if order == 1 {
            vec![0.5]
        } else {
            solve(c.r.clone(), c.b.clone())
        };
        let x_t_ = (last.affine(c.c_x, 0.0)? - m0.affine(c.c_m0, 0.0)?)?;
        let d1_t = (model_t - m0)?.affine(rhos[order - 1], 0.0)?;
        let res = match Self::weighted_diffs(&ms, m0, &c.rks, &rhos)? {
            Some(r) => (r + d1_t)?,
            None => d1_t,
        };
        x_t_ - res.affine(c.c_res, 0.0)?
    }
}

struct Coeffs {
    rks: Vec<f64>,
    r: Vec<Vec<f64>>,
    b: Vec<f64>,
    c_x: f64,
    c_m0: f64,
    c_res: f64,
}

impl FlowScheduler for UniPcScheduler {
    fn set_timesteps(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            bail!("UniPC: the number of inference steps must be at least 1");
        }
        let nt = self.config.num_train_timesteps as f64;
        let shift = self.config.flow_shift;
        let mut sig: Vec<f64> = match self.config.sigma_spacing {
            SigmaSpacing::Diffusers => linspace(1.0, 1.0 / nt, n + 1),
            // fm_solvers_unipc.py: sigma_max is the f32 of 1 − 1/N, sigma_min 0.
            SigmaSpacing::WanOriginal => linspace((1.0 - 1.0 / nt) as f32 as f64, 0.0, n + 1),
        };
        sig.truncate(n);
        for s in sig.iter_mut() {
            *s = shift_sigma(shift, *s);
        }
        if self.config.sigma_spacing == SigmaSpacing::Diffusers && (sig[0] - 1.0).abs() < 1e-6 {
            // α = 1 − σ must stay positive: the solver takes log(α)
            sig[0] -= 1e-6;
        }
        // int64 cast: truncation
        self.timesteps = sig.iter().map(|s| (s * nt).trunc()).collect();
        let last = match self.final_sigmas {
            FinalSigmas::Zero => 0.0,
            FinalSigmas::SigmaMin => sig[n - 1],
        };
        self.sigmas = sig
            .iter()
            .chain(std::iter::once(&last))
            .map(|&s| s as f32)
            .collect();
        self.history.clear();
        self.lower_order_nums = 0;
        self.this_order = 0;
        self.last_sample = None;
        self.next_step = 0;
        Ok(())
    }

    fn timesteps(&self) -> &[f64] {
        &self.timesteps
    }

    fn sigmas(&self) -> &[f32] {
        &self.sigmas
    }

    fn num_train_timesteps(&self) -> usize {
        self.config.num_train_timesteps
    }

    fn step(&mut self, model_output: &Tensor, step: usize, sample: &Tensor) -> Result<Tensor> {
        let n = self.timesteps.len();
        check_step_order("UniPC", n, step, self.next_step)?;
        check_step_inputs(model_output, sample)?;
        if let Some(m) = self.history.last() {
            if m.dims() != sample.dims() {
                bail!(
                    "UniPC: sample shape {:?} differs from the previous step's {:?}",
                    sample.dims(),
                    m.dims()
                );
            }
        }
        let out_dtype = sample.dtype();
        let k = step;
        let order = self.config.solver_order;
        let x0 = data_estimate(sample, model_output, self.sigmas[k])?;
        let mut x = sample.to_dtype(DType::F32)?;
        let use_corrector = k > 0 && !self.config.disable_corrector.contains(&(k - 1));
        if use_corrector {
            if let Some(last) = &self.last_sample {
                x = self.correct(k, last, &x0, self.this_order)?;
            }
        }
        self.history.push(x0);
        if self.history.len() > order {
            self.history.remove(0);
        }
        let this_order = if self.config.lower_order_final {
            order.min(n - k)
        } else {
            order
        };
        self.this_order = this_order.min(self.lower_order_nums + 1);
        let prev = self.predict(k, &x, self.this_order)?;
        self.last_sample = Some(x);
        if self.lower_order_nums < order {
            self.lower_order_nums += 1;
        }
        self.next_step += 1;
        prev.to_dtype(out_dtype)
    }
}

/// The config of diffusers' `FlowMatchEulerDiscreteScheduler` as far as Wan uses it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct EulerConfig {
    pub num_train_timesteps: usize,
    pub shift: f64,
}

impl Default for EulerConfig {
    fn default() -> Self {
        Self {
            num_train_timesteps: 1000,
            shift: 1.0,
        }
    }
}

impl EulerConfig {
    /// The Euler sampler with a UniPC config's training steps and shift.
    pub fn from_unipc(c: &UniPcConfig) -> Self {
        Self {
            num_train_timesteps: c.num_train_timesteps,
            shift: c.flow_shift,
        }
    }
}

/// diffusers' `FlowMatchEulerDiscreteScheduler` (deterministic): `x ← x + (σ_next − σ)·v`.
///
/// Its schedule is diffusers', quirks included: the training sigmas are shifted once when the
/// scheduler is built, and `set_timesteps` spaces timesteps between the shifted extremes and
/// shifts them again, so the last sigma is small but not `1/N`-sized.
#[derive(Clone, Debug)]
pub struct FlowEulerScheduler {
    config: EulerConfig,
    timesteps: Vec<f64>,
    sigmas: Vec<f32>,
    next_step: usize,
}

impl FlowEulerScheduler {
    pub fn new(config: EulerConfig) -> Result<Self> {
        if config.num_train_timesteps == 0 {
            bail!("Euler: num_train_timesteps is 0");
        }
        if !(config.shift.is_finite() && config.shift > 0.0) {
            bail!("Euler: shift {} must be positive", config.shift);
        }
        Ok(Self {
            config,
            timesteps: Vec::new(),
            sigmas: Vec::new(),
            next_step: 0,
        })
    }

    pub fn config(&self) -> &EulerConfig {
        &self.config
    }

    /// The shift in f32 arithmetic, as `__init__` applies it to the training sigmas.
    fn shift_f32(&self, sigma: f32) -> f32 {
        let s = self.config.shift;
        (s as f32 * sigma) / (1.0f32 + (s - 1.0) as f32 * sigma)
    }
}

impl FlowScheduler for FlowEulerScheduler {
    fn set_timesteps(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            bail!("Euler: the number of inference steps must be at least 1");
        }
        let nt = self.config.num_train_timesteps;
        let ntf = nt as f32;
        // training sigmas: linspace(1, N, N)[::-1] / N, shifted in f32
        // the first training sigma is N / N = 1
        let sigma_max = self.shift_f32(1.0) as f64;
        let sigma_min = self.shift_f32(1.0f32 / ntf) as f64;
        let t = linspace(sigma_max * nt as f64, sigma_min * nt as f64, n);
        let sig: Vec<f32> = t
            .iter()
            .map(|&t| shift_sigma(self.config.shift, t / nt as f64) as f32)
            .collect();
        self.timesteps = sig.iter().map(|&s| (s * ntf) as f64).collect();
        self.sigmas = sig.into_iter().chain(std::iter::once(0.0)).collect();
        self.next_step = 0;
        Ok(())
    }

    fn timesteps(&self) -> &[f64] {
        &self.timesteps
    }

    fn sigmas(&self) -> &[f32] {
        &self.sigmas
    }

    fn num_train_timesteps(&self) -> usize {
        self.config.num_train_timesteps
    }

    /// The sample stays in its own dtype (diffusers casts it to the model output's).
    fn step(&mut self, model_output: &Tensor, step: usize, sample: &Tensor) -> Result<Tensor> {
        check_step_order("Euler", self.timesteps.len(), step, self.next_step)?;
        check_step_inputs(model_output, sample)?;
        let dt = self.sigmas[step + 1] - self.sigmas[step];
        let dv = model_output.affine(dt as f64, 0.0)?.to_dtype(DType::F32)?;
        let out = (sample.to_dtype(DType::F32)? + dv)?;
        self.next_step += 1;
        out.to_dtype(sample.dtype())
    }
}

/// Which sampler to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplerKind {
    UniPc,
    Euler,
}

impl SamplerKind {
    /// `unipc` or `euler`.
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "unipc" => Ok(Self::UniPc),
            "euler" => Ok(Self::Euler),
            _ => bail!("unknown sampler {name:?}; known: unipc, euler"),
        }
    }

    /// The sampler, built from a repo's UniPC config (Euler takes its training steps and
    /// shift).
    pub fn build(self, config: &UniPcConfig) -> Result<Box<dyn FlowScheduler>> {
        Ok(match self {
            Self::UniPc => Box::new(UniPcScheduler::new(config.clone())?),
            Self::Euler => Box::new(FlowEulerScheduler::new(EulerConfig::from_unipc(config))?),
        })
    }
}

/// The A14B expert switch: the index of the first step that runs the low-noise expert, i.e.
/// the first timestep below `boundary_ratio · num_train_timesteps` (diffusers
/// `pipeline_wan.py` and the original `text2video.py` run the high-noise expert while
/// `t >= boundary`). `timesteps.len()` if every step is high-noise.
pub fn expert_switch_step(
    timesteps: &[f64],
    boundary_ratio: f64,
    num_train_timesteps: usize,
) -> Result<usize> {
    if !(0.0..=1.0).contains(&boundary_ratio) {
        bail!("boundary_ratio {boundary_ratio} is not in [0, 1]");
    }
    let boundary = boundary_ratio * num_train_timesteps as f64;
    Ok(timesteps
        .iter()
        .position(|&t| t < boundary)
        .unwrap_or(timesteps.len()))
}

/// The expert of step `step` (0 = high noise, 1 = low noise) given the switch step.
pub fn expert_of_step(step: usize, switch_step: usize) -> usize {
    usize::from(step >= switch_step)
}
