//! Video fidelity metrics against scikit-image / numpy values
//! (`scripts/gen_wan_fidelity_fixtures.py`).

use candle_core::{Device, Tensor};
use mxattn_video::RgbFrames;
use mxattn_wan::fidelity::{
    cosine, flicker_series, pearson, psnr_u8, rel_l2, ssim_u8, VideoFidelity,
};
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan/fidelity")
}

fn videos() -> (RgbFrames, RgbFrames, serde_json::Value) {
    let t = candle_core::safetensors::load(dir().join("videos.safetensors"), &Device::Cpu).unwrap();
    let conv = |name: &str| RgbFrames::from_tensor(&t[name]).unwrap();
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("expected.json")).unwrap())
            .unwrap();
    (conv("reference"), conv("test"), exp)
}

fn floats(v: &serde_json::Value) -> Vec<Option<f64>> {
    v.as_array().unwrap().iter().map(|x| x.as_f64()).collect()
}

#[test]
fn per_frame_psnr_and_ssim_match_skimage() {
    let (r, t, exp) = videos();
    assert_eq!((r.width, r.height, r.len()), (32, 24, 5));
    let fid = VideoFidelity::compare(&t, &r).unwrap();
    for (i, (got, want)) in fid.psnr.iter().zip(floats(&exp["psnr"])).enumerate() {
        match want {
            Some(w) => assert!((got - w).abs() < 1e-9, "psnr frame {i}: {got} vs {w}"),
            None => assert!(got.is_infinite() && *got > 0.0, "frame {i} is identical"),
        }
    }
    for (i, (got, want)) in fid.ssim.iter().zip(floats(&exp["ssim"])).enumerate() {
        let w = want.unwrap();
        assert!((got - w).abs() < 1e-9, "ssim frame {i}: {got} vs {w}");
    }
    // the identical frame counts at the cap, the others at their value
    let capped = fid.mean_psnr(60.0);
    let finite: f64 = fid.psnr.iter().filter(|p| p.is_finite()).sum();
    assert!((capped - (finite + 60.0) / 5.0).abs() < 1e-9);
}

#[test]
fn temporal_consistency_matches_numpy() {
    let (r, t, exp) = videos();
    let fid = VideoFidelity::compare(&t, &r).unwrap();
    for (got, want) in [
        (&fid.flicker_reference, &exp["flicker_reference"]),
        (&fid.flicker_test, &exp["flicker_test"]),
    ] {
        let want = floats(want);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w.unwrap()).abs() < 1e-12);
        }
    }
    let c = fid.temporal_correlation.unwrap();
    assert!((c - exp["temporal_correlation"].as_f64().unwrap()).abs() < 1e-12);
    // a video against itself: perfect scores
    let same = VideoFidelity::compare(&r, &r).unwrap();
    assert!(same.psnr.iter().all(|p| p.is_infinite()));
    assert!(same.ssim.iter().all(|s| (s - 1.0).abs() < 1e-12));
    assert!((same.temporal_correlation.unwrap() - 1.0).abs() < 1e-12);
}

#[test]
fn latent_distances() {
    let dev = Device::Cpu;
    let a = Tensor::new(&[3f32, 4.0, 0.0], &dev).unwrap();
    let b = Tensor::new(&[3f32, 0.0, 0.0], &dev).unwrap();
    // ‖a − b‖ = 4, ‖b‖ = 3
    assert!((rel_l2(&a, &b).unwrap() - 4.0 / 3.0).abs() < 1e-12);
    assert!((cosine(&a, &b).unwrap() - 0.6).abs() < 1e-12);
    assert_eq!(rel_l2(&b, &b).unwrap(), 0.0);
    let c = Tensor::new(&[1f32, 2.0], &dev).unwrap();
    assert!(rel_l2(&a, &c).is_err(), "shape mismatch is an error");
    let nan = Tensor::new(&[f32::NAN, 0.0, 0.0], &dev).unwrap();
    assert!(rel_l2(&nan, &b).is_err(), "NaN input is an error");
}

#[test]
fn bad_input_is_an_error() {
    let (r, _, _) = videos();
    let small = RgbFrames::new(8, 8, vec![vec![0u8; 8 * 8 * 3]; 5]).unwrap();
    assert!(VideoFidelity::compare(&small, &r).is_err(), "size mismatch");
    assert!(
        ssim_u8(&small.frames[0], &small.frames[0], 8, 8).is_err(),
        "below 11x11"
    );
    assert!(psnr_u8(&[1, 2, 3], &[1, 2]).is_err());
    assert_eq!(
        pearson(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]),
        None,
        "constant series"
    );
    let one = RgbFrames::new(8, 8, vec![vec![0u8; 8 * 8 * 3]]).unwrap();
    assert!(flicker_series(&one).is_empty());
}
