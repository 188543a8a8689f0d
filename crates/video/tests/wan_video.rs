//! Writing videos: the MP4 read back box by box (`avc1` track, sample count, duration) and its
//! first frames decoded with OpenH264; the GIF decoded frame by frame; PNG frames; tensor
//! conversion and input errors.

use candle_core::{DType, Device, Tensor};
use mxattn_video::{
    write_gif, write_mp4, write_png_frames, write_video, GifWriter, Mp4Writer, RgbFrames,
};
use openh264::decoder::Decoder;
use openh264::formats::YUVSource;
use std::path::PathBuf;

const W: usize = 64;
const H: usize = 48;
const FPS: f64 = 8.0;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mxattn-wan-video-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A 16-pixel red square moving right over a blue-grey gradient.
fn moving_square(frames: usize) -> RgbFrames {
    let v = (0..frames)
        .map(|f| {
            let mut rgb = vec![0u8; W * H * 3];
            for y in 0..H {
                for x in 0..W {
                    let p = (y * W + x) * 3;
                    let inside = (8 + 8 * f..24 + 8 * f).contains(&x) && (16..32).contains(&y);
                    let px = if inside {
                        [220, 30, 30]
                    } else {
                        [40, (60 + 2 * y) as u8, (80 + 2 * x) as u8]
                    };
                    rgb[p..p + 3].copy_from_slice(&px);
                }
            }
            rgb
        })
        .collect();
    RgbFrames::new(W, H, v).unwrap()
}

fn mean_abs_diff(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .sum::<f64>()
        / a.len() as f64
}

fn pixel(rgb: &[u8], x: usize, y: usize) -> [u8; 3] {
    let p = (y * W + x) * 3;
    [rgb[p], rgb[p + 1], rgb[p + 2]]
}

#[test]
fn mp4_has_an_avc1_track_with_every_frame_and_decodes() {
    let video = moving_square(5);
    let path = tmp("square.mp4");
    let summary = write_mp4(&path, &video, FPS).unwrap();
    assert_eq!(summary.frames, 5);

    let bytes = std::fs::read(&path).unwrap();
    let size = bytes.len() as u64;
    let mut mp4 = mp4::Mp4Reader::read_header(std::io::Cursor::new(bytes), size).unwrap();
    assert_eq!(mp4.tracks().len(), 1);
    let track = mp4.tracks().values().next().unwrap();
    let id = track.track_id();
    assert_eq!(track.track_type().unwrap(), mp4::TrackType::Video);
    assert_eq!(
        track.box_type().unwrap(),
        "avc1".parse::<mp4::FourCC>().unwrap()
    );
    assert_eq!(track.media_type().unwrap(), mp4::MediaType::H264);
    assert_eq!((track.width(), track.height()), (W as u16, H as u16));
    assert_eq!(track.sample_count(), 5);
    let secs = track.duration().as_secs_f64();
    assert!((secs - 5.0 / FPS).abs() < 1e-6, "track duration {secs} s");
    assert!((mp4.duration().as_secs_f64() - 5.0 / FPS).abs() < 1e-6);
    assert!(
        (track.frame_rate() - FPS).abs() < 1e-6,
        "{}",
        track.frame_rate()
    );
    let sps = track.sequence_parameter_set().unwrap().to_vec();
    let pps = track.picture_parameter_set().unwrap().to_vec();
    assert_eq!(sps[0] & 0x1f, 7);
    assert_eq!(pps[0] & 0x1f, 8);

    // AVCC samples → Annex B, parameter sets first, into OpenH264's decoder
    let mut dec = Decoder::new().unwrap();
    let mut head = Vec::new();
    for ps in [&sps, &pps] {
        head.extend_from_slice(&[0, 0, 0, 1]);
        head.extend_from_slice(ps);
    }
    let mut decoded = Vec::new();
    for s in 1..=5u32 {
        let sample = mp4.read_sample(id, s).unwrap().unwrap();
        assert_eq!(
            sample.is_sync,
            s == 1,
            "sample {s}: only the first is an IDR"
        );
        assert_eq!(sample.start_time, (s as u64 - 1) * 1000);
        let mut annexb = if s == 1 { head.clone() } else { Vec::new() };
        let mut rest = &sample.bytes[..];
        while !rest.is_empty() {
            let n = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
            annexb.extend_from_slice(&[0, 0, 0, 1]);
            annexb.extend_from_slice(&rest[4..4 + n]);
            rest = &rest[4 + n..];
        }
        let yuv = dec.decode(&annexb).unwrap().expect("a picture per sample");
        assert_eq!(yuv.dimensions(), (W, H));
        let mut rgb = vec![0u8; W * H * 3];
        yuv.write_rgb8(&mut rgb);
        decoded.push(rgb);
    }
    for (i, (got, want)) in decoded.iter().zip(&video.frames).enumerate() {
        let d = mean_abs_diff(got, want);
        println!("frame {i}: mean |decoded − written| = {d:.2} levels");
        assert!(d < 6.0, "frame {i}: {d}");
    }
    // the square is where it was drawn: red inside, not red outside
    let inside = pixel(&decoded[0], 15, 23);
    assert!(inside[0] > 180 && inside[1] < 80, "{inside:?}");
    let moved = pixel(&decoded[4], 15, 23);
    assert!(moved[0] < 100, "{moved:?}");
    let moved_in = pixel(&decoded[4], 47, 23);
    assert!(moved_in[0] > 180 && moved_in[1] < 80, "{moved_in:?}");
}

#[test]
fn gif_has_every_frame_and_the_right_size() {
    let video = moving_square(5);
    let path = tmp("square.gif");
    assert_eq!(write_gif(&path, &video, FPS).unwrap(), 5);
    let mut opts = gif::DecodeOptions::new();
    opts.set_color_output(gif::ColorOutput::RGBA);
    let mut dec = opts.read_info(std::fs::File::open(&path).unwrap()).unwrap();
    assert_eq!((dec.width() as usize, dec.height() as usize), (W, H));
    let mut n = 0;
    let mut total_delay = 0u32;
    while let Some(frame) = dec.read_next_frame().unwrap() {
        assert_eq!((frame.width as usize, frame.height as usize), (W, H));
        total_delay += frame.delay as u32;
        let rgb: Vec<u8> = frame
            .buffer
            .chunks(4)
            .flat_map(|p| p[..3].to_vec())
            .collect();
        let d = mean_abs_diff(&rgb, &video.frames[n]);
        assert!(d < 8.0, "gif frame {n}: {d}");
        n += 1;
    }
    assert_eq!(n, 5);
    // 5 frames at 8 fps = 62.5 cs, rounded once overall
    assert_eq!(total_delay, 63);
}

#[test]
fn png_frames_are_lossless() {
    let video = moving_square(3);
    let dir = tmp("pngs");
    let paths = write_png_frames(&dir, &video).unwrap();
    assert_eq!(paths.len(), 3);
    for (p, want) in paths.iter().zip(&video.frames) {
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(p).unwrap()));
        let mut r = dec.read_info().unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!((info.width as usize, info.height as usize), (W, H));
        assert_eq!(&buf[..info.buffer_size()], &want[..]);
    }
}

#[test]
fn tensors_convert_to_rgb() {
    // [3, F, H, W] in [-1, 1]: -1 → 0, 0 → 128, 1 → 255, clamped outside
    let vals = [-1.0f32, 0.0, 1.0, 2.0, -3.0, 0.5];
    let t = Tensor::from_vec(
        (0..3 * 2 * 2 * 4).map(|i| vals[i % 6]).collect::<Vec<_>>(),
        (3, 2, 2, 4),
        &Device::Cpu,
    )
    .unwrap();
    let f = RgbFrames::from_tensor(&t).unwrap();
    assert_eq!((f.width, f.height, f.len()), (4, 2, 2));
    let to_u8 = |x: f32| ((x.clamp(-1.0, 1.0) + 1.0) * 127.5).round() as u8;
    // frame 0, pixel (0, 0): channels at flat indices 0, 16, 32
    let want = [vals[0], vals[16 % 6], vals[32 % 6]].map(to_u8);
    assert_eq!(&f.frames[0][..3], &want);
    assert_eq!([to_u8(-1.0), to_u8(0.0), to_u8(1.0)], [0, 128, 255]);
    // a batch of 1 is accepted, so are [F, H, W, 3] u8 frames
    let f5 = RgbFrames::from_tensor(&t.unsqueeze(0).unwrap()).unwrap();
    assert_eq!(f5, f);
    let u = Tensor::from_vec(f.frames.concat(), (2, 2, 4, 3), &Device::Cpu).unwrap();
    assert_eq!(RgbFrames::from_tensor(&u).unwrap(), f);
    // and the streaming writers take tensors
    let video = moving_square(2);
    let u = Tensor::from_vec(video.frames.concat(), (2, H, W, 3), &Device::Cpu).unwrap();
    let mut w = Mp4Writer::create(tmp("t.mp4"), W, H, 16.0).unwrap();
    w.push_tensor(&u).unwrap();
    w.push_tensor(
        &u.to_dtype(DType::F32)
            .unwrap()
            .affine(1.0 / 127.5, -1.0)
            .unwrap()
            .permute((3, 0, 1, 2))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(w.finish().unwrap().frames, 4);
    let mut g = GifWriter::create(tmp("t.gif"), W, H, 16.0).unwrap();
    g.push_tensor(&u).unwrap();
    assert_eq!(g.finish().unwrap(), 2);
}

#[test]
fn bad_inputs_are_errors() {
    let e = |r: candle_core::Result<RgbFrames>| r.unwrap_err().to_string();
    let t = Tensor::zeros((4, 2, 8, 8), DType::F32, &Device::Cpu).unwrap();
    assert!(e(RgbFrames::from_tensor(&t)).contains("3 channels"));
    let t = Tensor::zeros((2, 8, 8), DType::F32, &Device::Cpu).unwrap();
    assert!(e(RgbFrames::from_tensor(&t)).contains("[3, frames, height, width]"));
    let mut v = vec![0f32; 3 * 2 * 2];
    v[7] = f32::NAN;
    let t = Tensor::from_vec(v, (3, 1, 2, 2), &Device::Cpu).unwrap();
    assert!(e(RgbFrames::from_tensor(&t)).contains("NaN"));
    assert!(RgbFrames::new(4, 4, vec![vec![0; 47]]).is_err());

    let odd = RgbFrames::new(5, 4, vec![vec![0; 60]]).unwrap();
    let err = write_mp4(tmp("odd.mp4"), &odd, 16.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("even") && err.contains("odd.mp4"), "{err}");
    // GIF and PNG take any size
    write_gif(tmp("odd.gif"), &odd, 16.0).unwrap();
    let video = moving_square(1);
    assert!(write_mp4(tmp("fps.mp4"), &video, 0.0)
        .unwrap_err()
        .to_string()
        .contains("fps"));
    assert!(write_gif(tmp("fps.gif"), &video, f64::NAN)
        .unwrap_err()
        .to_string()
        .contains("fps"));
    let err = write_video(tmp("x.avi"), &video, 16.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains(".mp4 or .gif"), "{err}");
    let w = Mp4Writer::create(tmp("empty.mp4"), W, H, 16.0).unwrap();
    assert!(w.finish().unwrap_err().to_string().contains("no frames"));
    let mut w = Mp4Writer::create(tmp("short.mp4"), W, H, 16.0).unwrap();
    assert!(w
        .push_rgb(&[0; 10])
        .unwrap_err()
        .to_string()
        .contains("bytes"));
    let t = Tensor::zeros((1, 8, 8, 3), DType::U8, &Device::Cpu).unwrap();
    assert!(w.push_tensor(&t).unwrap_err().to_string().contains("8x8"));
}

/// Past one MP4 chunk (1 s) and one IDR period (2 s): 40 frames at 16 fps.
#[test]
fn longer_mp4_has_periodic_keyframes() {
    let (w, h, n) = (128usize, 96usize, 40usize);
    let frames = (0..n)
        .map(|f| {
            (0..w * h * 3)
                .map(|i| ((i / 3 % w + f * 3 + (i % 3) * 50) % 256) as u8)
                .collect()
        })
        .collect();
    let video = RgbFrames::new(w, h, frames).unwrap();
    let path = tmp("long.mp4");
    write_video(&path, &video, 16.0).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let size = bytes.len() as u64;
    let mut mp4 = mp4::Mp4Reader::read_header(std::io::Cursor::new(bytes), size).unwrap();
    let id = *mp4.tracks().keys().next().unwrap();
    assert_eq!(mp4.sample_count(id).unwrap(), n as u32);
    assert!((mp4.duration().as_secs_f64() - 2.5).abs() < 1e-6);
    let sync: Vec<u32> = (1..=n as u32)
        .filter(|&s| mp4.read_sample(id, s).unwrap().unwrap().is_sync)
        .collect();
    assert_eq!(sync, vec![1, 33]);
}
