//! Decoded videos as RGB8 frames ([`RgbFrames`]), and (feature `encode`, on by default)
//! their writers: H.264 in `.mp4`, animated `.gif`, and PNG frames.
//!
//! * MP4: [OpenH264](https://crates.io/crates/openh264) (built from the source bundled in
//!   its crate, no download) encodes each frame as constrained-baseline H.264 (BT.601
//!   limited range, signalled in the VUI; no B-frames, so decode order is display order),
//!   and the [`mp4`](https://crates.io/crates/mp4) crate muxes it: an `avc1` track whose
//!   `avcC` holds the SPS/PPS, samples as 4-byte length-prefixed NAL units. Width and height
//!   must be even (4:2:0 chroma); Wan's sizes are multiples of 16.
//! * GIF: the [`gif`](https://crates.io/crates/gif) crate, a NeuQuant palette per frame,
//!   looping; frame delays are whole centiseconds, spread so the total length is `F / fps`.
//! * PNG: the [`png`](https://crates.io/crates/png) crate, one RGB8 file per frame.
//!
//! Frames come in as `[3, F, H, W]` (or `[1, 3, F, H, W]`) float tensors in [-1, 1], the VAE's
//! output, mapped to `round((x + 1) · 127.5)`, or as `[F, H, W, 3]` u8 tensors. The streaming
//! writers ([`Mp4Writer`], [`GifWriter`]) take frames as they come, e.g. from
//! a VAE that decodes chunk by chunk, so a long video never has to be held whole.

use candle_core::{bail, DType, Result, Tensor};

/// Frames as packed RGB8, `width · height · 3` bytes each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbFrames {
    pub width: usize,
    pub height: usize,
    pub frames: Vec<Vec<u8>>,
}

impl RgbFrames {
    /// Checks that every frame has `width · height · 3` bytes.
    pub fn new(width: usize, height: usize, frames: Vec<Vec<u8>>) -> Result<Self> {
        if width == 0 || height == 0 {
            bail!("video: empty frame size {width}x{height}");
        }
        if let Some(i) = frames.iter().position(|f| f.len() != width * height * 3) {
            bail!(
                "video: frame {i} has {} bytes, {width}x{height} RGB needs {}",
                frames[i].len(),
                width * height * 3
            );
        }
        Ok(Self {
            width,
            height,
            frames,
        })
    }

    /// From `[3, F, H, W]` / `[1, 3, F, H, W]` floats in [-1, 1] (values outside are clamped;
    /// NaN is an error) or `[F, H, W, 3]` u8.
    pub fn from_tensor(t: &Tensor) -> Result<Self> {
        let (w, h, frames) = if t.dtype() == DType::U8 {
            let (f, h, w, c) = t.dims4().map_err(|_| {
                candle_core::Error::Msg(format!(
                    "video: u8 frames must be [frames, height, width, 3], got {:?}",
                    t.dims()
                ))
            })?;
            if c != 3 {
                bail!(
                    "video: u8 frames must have 3 channels last, got {:?}",
                    t.dims()
                );
            }
            let frames = (0..f)
                .map(|i| t.get(i)?.flatten_all()?.to_vec1::<u8>())
                .collect::<Result<Vec<_>>>()?;
            (w, h, frames)
        } else {
            let t = match t.rank() {
                5 if t.dim(0)? == 1 => t.squeeze(0)?,
                4 => t.clone(),
                _ => bail!(
                    "video: float frames must be [3, frames, height, width] (or with a batch of 1), got {:?}",
                    t.dims()
                ),
            };
            let (c, f, h, w) = t.dims4()?;
            if c != 3 {
                bail!(
                    "video: float frames must have 3 channels first, got {:?}",
                    t.dims()
                );
            }
            let frames = (0..f)
                .map(|i| float_frame_to_rgb(&t.narrow(1, i, 1)?.squeeze(1)?, i))
                .collect::<Result<Vec<_>>>()?;
            (w, h, frames)
        };
        Self::new(w, h, frames)
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
}

/// `[3, H, W]` floats in [-1, 1] → packed RGB8.
fn float_frame_to_rgb(x: &Tensor, index: usize) -> Result<Vec<u8>> {
    let x = x.to_dtype(DType::F32)?;
    let v = x.permute((1, 2, 0))?.flatten_all()?.to_vec1::<f32>()?;
    v.iter()
        .enumerate()
        .map(|(j, &x)| {
            if x.is_nan() {
                bail!("video: frame {index} holds NaN at flat index {j}");
            }
            Ok(((x.clamp(-1.0, 1.0) + 1.0) * 127.5).round() as u8)
        })
        .collect()
}

#[cfg(feature = "encode")]
mod write;
#[cfg(feature = "encode")]
pub use write::*;
