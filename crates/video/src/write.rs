//! The writers (feature `encode`): see the crate docs.

use crate::RgbFrames;
use candle_core::{bail, Result, Tensor};
use openh264::encoder::{
    Encoder, EncoderConfig, FrameRate, FrameType, IntraFramePeriod, Profile, QpRange,
    RateControlMode, VuiConfig,
};
use openh264::formats::{RgbSliceU8, YUVBuffer};
use openh264::OpenH264API;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

fn err(path: &Path, what: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("{}: {what}", path.display()))
}

/// A packed RGB8 frame (number `index`) must hold `width · height · 3` bytes.
fn check_frame_bytes(rgb: &[u8], path: &Path, (w, h): (usize, usize), index: u64) -> Result<()> {
    if rgb.len() != w * h * 3 {
        return Err(err(
            path,
            format!(
                "frame {index} has {} bytes, {w}x{h} RGB needs {}",
                rgb.len(),
                w * h * 3
            ),
        ));
    }
    Ok(())
}

/// `frames` as RGB8, which must be `size` (a writer's width and height).
fn frames_of_size(
    frames: &Tensor,
    path: &Path,
    size: (usize, usize),
    what: &str,
) -> Result<RgbFrames> {
    let f = RgbFrames::from_tensor(frames)?;
    if (f.width, f.height) != size {
        return Err(err(
            path,
            format!(
                "frames are {}x{}, the {what} {}x{}",
                f.width, f.height, size.0, size.1
            ),
        ));
    }
    Ok(f)
}

fn check_fps(fps: f64) -> Result<()> {
    if !(fps.is_finite() && fps > 0.0 && fps <= 1000.0) {
        bail!("video: fps must be a number in (0, 1000], got {fps}");
    }
    Ok(())
}

/// What an MP4 holds, as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Mp4Summary {
    pub path: PathBuf,
    pub width: usize,
    pub height: usize,
    pub frames: usize,
    pub fps: f64,
    /// Bytes of H.264 sample data.
    pub video_bytes: usize,
}

/// A streaming H.264 `.mp4` writer: [`Self::push_rgb`] / [`Self::push_tensor`] per frame,
/// then [`Self::finish`].
pub struct Mp4Writer {
    path: PathBuf,
    encoder: Encoder,
    mux: mp4::Mp4Writer<BufWriter<File>>,
    track_added: bool,
    width: usize,
    height: usize,
    fps: f64,
    /// Track timescale ticks per frame (the timescale is `fps · TICKS`).
    ticks: u32,
    frames: u64,
    video_bytes: usize,
}

/// Ticks per frame: the track timescale is `round(fps · TICKS)`, so fractional rates such as
/// 23.976 are exact to 0.001 fps.
const TICKS: u32 = 1000;

fn timescale(fps: f64) -> u32 {
    (fps * TICKS as f64).round() as u32
}

impl Mp4Writer {
    /// Creates `path` for `width × height` frames at `fps` (constant quality, QP 16–30).
    pub fn create(path: impl AsRef<Path>, width: usize, height: usize, fps: f64) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        check_fps(fps)?;
        if width == 0 || height == 0 || !width.is_multiple_of(2) || !height.is_multiple_of(2) {
            return Err(err(
                &path,
                format!(
                    "H.264 4:2:0 needs an even, non-zero width and height, got {width}x{height}"
                ),
            ));
        }
        if width.max(height) > 3840 || width.min(height) > 2160 {
            return Err(err(
                &path,
                format!("{width}x{height} is above OpenH264's 3840x2160 limit"),
            ));
        }
        let config = EncoderConfig::new()
            .max_frame_rate(FrameRate::from_hz(fps as f32))
            // constant quality, no rate control: Wan's clips are short and a bitrate target
            // would need frame skipping, which would drop frames
            .rate_control_mode(RateControlMode::Off)
            .qp(QpRange::new(16, 30))
            // every frame becomes a sample: the MP4's sample count is the frame count
            .skip_frames(false)
            .profile(Profile::Baseline)
            // an IDR every 2 s, for seeking
            .intra_frame_period(IntraFramePeriod::from_num_frames(
                (2.0 * fps).ceil().max(1.0) as u32,
            ))
            // openh264's RGB → YUV conversion is BT.601 limited range
            .vui(VuiConfig::bt601());
        let encoder = Encoder::with_api_config(OpenH264API::from_source(), config)
            .map_err(|e| err(&path, format!("OpenH264 encoder: {e}")))?;
        let file = File::create(&path).map_err(|e| err(&path, e))?;
        let mp4_config = mp4::Mp4Config {
            major_brand: "isom".parse().expect("a four-character code"),
            minor_version: 512,
            compatible_brands: ["isom", "iso2", "avc1", "mp41"]
                .iter()
                .map(|b| b.parse().expect("a four-character code"))
                .collect(),
            // the movie's timescale is the track's: the mp4 crate converts each sample's
            // duration to the movie timescale with truncation, which would shorten the
            // movie (62.5 → 62 ms per frame at 16 fps)
            timescale: timescale(fps),
        };
        let mux = mp4::Mp4Writer::write_start(BufWriter::new(file), &mp4_config)
            .map_err(|e| err(&path, format!("MP4: {e}")))?;
        Ok(Self {
            path,
            encoder,
            mux,
            track_added: false,
            width,
            height,
            fps,
            ticks: TICKS,
            frames: 0,
            video_bytes: 0,
        })
    }

    /// Encodes one packed RGB8 frame.
    pub fn push_rgb(&mut self, rgb: &[u8]) -> Result<()> {
        let (w, h) = (self.width, self.height);
        check_frame_bytes(rgb, &self.path, (w, h), self.frames)?;
        let yuv = YUVBuffer::from_rgb8_source(RgbSliceU8::new(rgb, (w, h)));
        let stream = self
            .encoder
            .encode(&yuv)
            .map_err(|e| err(&self.path, format!("OpenH264 frame {}: {e}", self.frames)))?;
        let is_sync = matches!(stream.frame_type(), FrameType::IDR);
        let (mut sps, mut pps) = (None, None);
        let mut sample = Vec::new();
        for l in 0..stream.num_layers() {
            let layer = stream.layer(l).expect("layer index below num_layers");
            for n in 0..layer.nal_count() {
                let nal = strip_start_code(layer.nal_unit(n).expect("NAL index below nal_count"));
                match nal.first().map(|b| b & 0x1f) {
                    // parameter sets go to the avcC box (an `avc1` track keeps them out of band)
                    Some(7) => sps = Some(nal.to_vec()),
                    Some(8) => pps = Some(nal.to_vec()),
                    Some(_) => {
                        sample.extend_from_slice(&(nal.len() as u32).to_be_bytes());
                        sample.extend_from_slice(nal);
                    }
                    None => {}
                }
            }
        }
        if !self.track_added {
            let (Some(sps), Some(pps)) = (sps, pps) else {
                return Err(err(
                    &self.path,
                    "OpenH264 gave no SPS/PPS with the first frame",
                ));
            };
            let track = mp4::TrackConfig {
                track_type: mp4::TrackType::Video,
                timescale: timescale(self.fps),
                language: "und".to_string(),
                media_conf: mp4::MediaConfig::AvcConfig(mp4::AvcConfig {
                    width: w as u16,
                    height: h as u16,
                    seq_param_set: sps,
                    pic_param_set: pps,
                }),
            };
            self.mux
                .add_track(&track)
                .map_err(|e| err(&self.path, format!("MP4: {e}")))?;
            self.track_added = true;
        }
        if sample.is_empty() {
            return Err(err(
                &self.path,
                format!("OpenH264 produced no picture for frame {}", self.frames),
            ));
        }
        self.video_bytes += sample.len();
        let s = mp4::Mp4Sample {
            start_time: self.frames * self.ticks as u64,
            duration: self.ticks,
            rendering_offset: 0,
            is_sync,
            bytes: sample.into(),
        };
        self.mux
            .write_sample(1, &s)
            .map_err(|e| err(&self.path, format!("MP4 sample {}: {e}", self.frames)))?;
        self.frames += 1;
        Ok(())
    }

    /// Encodes `[3, t, H, W]` (or `[1, 3, t, H, W]`) float frames in [-1, 1], or `[t, H, W, 3]`
    /// u8 frames.
    pub fn push_tensor(&mut self, frames: &Tensor) -> Result<()> {
        let f = frames_of_size(frames, &self.path, (self.width, self.height), "video")?;
        f.frames.iter().try_for_each(|rgb| self.push_rgb(rgb))
    }

    /// Writes the index (`moov`) and closes the file.
    pub fn finish(mut self) -> Result<Mp4Summary> {
        if self.frames == 0 {
            return Err(err(&self.path, "no frames were written"));
        }
        self.mux
            .write_end()
            .map_err(|e| err(&self.path, format!("MP4: {e}")))?;
        use std::io::Write;
        self.mux
            .into_writer()
            .flush()
            .map_err(|e| err(&self.path, e))?;
        Ok(Mp4Summary {
            path: self.path,
            width: self.width,
            height: self.height,
            frames: self.frames as usize,
            fps: self.fps,
            video_bytes: self.video_bytes,
        })
    }
}

/// A NAL unit without its Annex B start code (`00 00 01` or `00 00 00 01`).
fn strip_start_code(nal: &[u8]) -> &[u8] {
    if nal.starts_with(&[0, 0, 0, 1]) {
        &nal[4..]
    } else if nal.starts_with(&[0, 0, 1]) {
        &nal[3..]
    } else {
        nal
    }
}

/// A streaming animated-GIF writer (loops forever).
pub struct GifWriter {
    path: PathBuf,
    encoder: gif::Encoder<BufWriter<File>>,
    width: usize,
    height: usize,
    fps: f64,
    frames: usize,
}

impl GifWriter {
    pub fn create(path: impl AsRef<Path>, width: usize, height: usize, fps: f64) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        check_fps(fps)?;
        if width == 0 || height == 0 || width > u16::MAX as usize || height > u16::MAX as usize {
            return Err(err(
                &path,
                format!("GIF frames must be 1..=65535 pixels a side, got {width}x{height}"),
            ));
        }
        let file = File::create(&path).map_err(|e| err(&path, e))?;
        let mut encoder = gif::Encoder::new(BufWriter::new(file), width as u16, height as u16, &[])
            .map_err(|e| err(&path, format!("GIF: {e}")))?;
        encoder
            .set_repeat(gif::Repeat::Infinite)
            .map_err(|e| err(&path, format!("GIF: {e}")))?;
        Ok(Self {
            path,
            encoder,
            width,
            height,
            fps,
            frames: 0,
        })
    }

    pub fn push_rgb(&mut self, rgb: &[u8]) -> Result<()> {
        let (w, h) = (self.width, self.height);
        check_frame_bytes(rgb, &self.path, (w, h), self.frames as u64)?;
        let mut frame = gif::Frame::from_rgb_speed(w as u16, h as u16, rgb, 10);
        // whole centiseconds, the rounding spread so frame i ends at round(100 (i + 1) / fps)
        let end = |i: usize| (100.0 * i as f64 / self.fps).round() as u64;
        frame.delay = (end(self.frames + 1) - end(self.frames)).min(u16::MAX as u64) as u16;
        self.encoder
            .write_frame(&frame)
            .map_err(|e| err(&self.path, format!("GIF frame {}: {e}", self.frames)))?;
        self.frames += 1;
        Ok(())
    }

    /// As [`Mp4Writer::push_tensor`].
    pub fn push_tensor(&mut self, frames: &Tensor) -> Result<()> {
        let f = frames_of_size(frames, &self.path, (self.width, self.height), "GIF")?;
        f.frames.iter().try_for_each(|rgb| self.push_rgb(rgb))
    }

    /// Writes the trailer; returns the frame count.
    pub fn finish(self) -> Result<usize> {
        if self.frames == 0 {
            return Err(err(&self.path, "no frames were written"));
        }
        use std::io::Write;
        self.encoder
            .into_inner()
            .map_err(|e| err(&self.path, format!("GIF: {e}")))?
            .flush()
            .map_err(|e| err(&self.path, e))?;
        Ok(self.frames)
    }
}

/// Writes all frames as an H.264 `.mp4`.
pub fn write_mp4(path: impl AsRef<Path>, video: &RgbFrames, fps: f64) -> Result<Mp4Summary> {
    let mut w = Mp4Writer::create(path, video.width, video.height, fps)?;
    video.frames.iter().try_for_each(|f| w.push_rgb(f))?;
    w.finish()
}

/// Writes all frames as a looping `.gif`.
pub fn write_gif(path: impl AsRef<Path>, video: &RgbFrames, fps: f64) -> Result<usize> {
    let mut w = GifWriter::create(path, video.width, video.height, fps)?;
    video.frames.iter().try_for_each(|f| w.push_rgb(f))?;
    w.finish()
}

/// Writes one RGB8 PNG.
pub fn write_png(path: impl AsRef<Path>, width: usize, height: usize, rgb: &[u8]) -> Result<()> {
    let path = path.as_ref();
    if rgb.len() != width * height * 3 || width == 0 || height == 0 {
        return Err(err(
            path,
            format!("{} bytes is not a {width}x{height} RGB image", rgb.len()),
        ));
    }
    let file = File::create(path).map_err(|e| err(path, e))?;
    let mut enc = png::Encoder::new(BufWriter::new(file), width as u32, height as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc
        .write_header()
        .map_err(|e| err(path, format!("PNG: {e}")))?;
    w.write_image_data(rgb)
        .map_err(|e| err(path, format!("PNG: {e}")))?;
    w.finish().map_err(|e| err(path, format!("PNG: {e}")))
}

/// Writes `dir/frame_00000.png`, … (the directory is created); returns the paths.
pub fn write_png_frames(dir: impl AsRef<Path>, video: &RgbFrames) -> Result<Vec<PathBuf>> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    video
        .frames
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let p = dir.join(format!("frame_{i:05}.png"));
            write_png(&p, video.width, video.height, f)?;
            Ok(p)
        })
        .collect()
}

/// Writes `.mp4` or `.gif` by the path's extension.
pub fn write_video(path: impl AsRef<Path>, video: &RgbFrames, fps: f64) -> Result<()> {
    let path = path.as_ref();
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("mp4") => write_mp4(path, video, fps).map(|_| ()),
        Some("gif") => write_gif(path, video, fps).map(|_| ()),
        _ => Err(err(
            path,
            "unknown video format; use .mp4 or .gif (or write_png_frames)",
        )),
    }
}
