//! The `extern "C"` launchers of `kernels/*.cu` and the parameter block they share with
//! Rust (`kernels/attention_params.h`: same fields, same order).

use std::ffi::c_void;

/// `cudaStream_t` / `CUstream` (the runtime and driver handles are the same pointer).
pub type Stream = *mut c_void;

pub const MXA_OK: i32 = 0;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OperandFmt {
    pub kind: i32,
    pub elem: i32,
    pub scale: i32,
    pub block: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    pub b: i32,
    pub hq: i32,
    pub hkv: i32,
    pub sq: i32,
    pub sk: i32,
    pub d: i32,
    pub causal: i32,
    pub in_dtype: i32,
    pub out_dtype: i32,
    pub with_lse: i32,
    pub softmax_scale: f32,
    pub q_scale: f32,
    pub score_scale: f32,
    pub hadamard: i32,
    pub qk: OperandFmt,
    pub v: OperandFmt,
    pub algo: i32,
    pub p_kind: i32,
    pub p_elem: i32,
    pub p_scale: i32,
    pub p_block: i32,
    pub fused_kind: i32,
    pub fused_g: f32,
    pub fused_off: f32,
    pub fused_thr: f32,
    pub efq_kind: i32,
    pub efq_scale: i32,
    pub efq_block: i32,
    pub efq_tau: f32,
    pub efq_h: f32,
    pub ln2: f32,
    pub log2e: f32,
    pub ln_2_over_9: f32,
    pub ln6: f32,
    pub log2_6: f32,
    pub lut_tau: f32,
    pub lut_h: f32,
    pub log2_075: f32,
    pub log2_125: f32,
    pub hadamard_scale: f32,
    pub log2_mid: [f32; 7],
    pub kv_lens: *const i32,
    pub thr_pow2: *const f32,
    pub thr_six: *const f32,
    pub thr_code: *const f32,
}

/// `kernels/attention_decode.cu` `DecodeParams` (same fields, same order).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DecodeParams {
    pub b: i32,
    pub hq: i32,
    pub hkv: i32,
    pub sq: i32,
    pub n: i32,
    pub causal: i32,
    pub scale_log2: f32,
    pub q_dtype: i32,
    pub out_dtype: i32,
    pub k_kind: i32,
    pub k_fmt: i32,
    pub v_kind: i32,
    pub v_fmt: i32,
    pub v_full: i32,
    pub v_row_bytes: i32,
    pub v_tail_kind: i32,
    pub splits: i32,
    pub q: *const c_void,
    pub k: *const c_void,
    pub k_sc: *const u8,
    pub v: *const c_void,
    pub v_sc: *const u8,
    pub v_tail: *const c_void,
    pub part_o: *mut f32,
    pub part_ml: *mut f32,
    pub out: *mut c_void,
}

extern "C" {
    // fused elementwise ops (kernels/ada_layer_norm.cu, split_heads.cu, bias_residual.cu,
    // bias_gelu.cu); dtype 0 f32, 1 bf16, 2 f16; null pointers for absent parts
    pub fn mxa_ada_layer_norm(
        x: *const c_void,
        y: *mut c_void,
        dtype: i32,
        rows: i64,
        n: i64,
        d: i64,
        w: *const f32,
        b: *const f32,
        shift: *const f32,
        sh_b: i64,
        sh_n: i64,
        sh_add: *const f32,
        scale: *const f32,
        sc_b: i64,
        sc_n: i64,
        sc_add: *const f32,
        eps: f32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_split_heads(
        t: *const c_void,
        y: *mut c_void,
        dtype: i32,
        rows: i64,
        n: i64,
        heads: i64,
        hd: i64,
        bias: *const c_void,
        norm_w: *const c_void,
        eps: f32,
        cos: *const f32,
        sin: *const f32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_bias_residual(
        x: *const c_void,
        y: *const c_void,
        out: *mut c_void,
        dtype: i32,
        rows: i64,
        n: i64,
        d: i64,
        bias: *const c_void,
        gate: *const f32,
        g_b: i64,
        g_n: i64,
        g_add: *const f32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_merge_heads(
        o: *const c_void,
        y: *mut c_void,
        dtype: i32,
        rows: i64,
        n: i64,
        heads: i64,
        hd: i64,
        stream: Stream,
    ) -> i32;
    pub fn mxa_bias_gelu(
        t: *const c_void,
        out: *mut c_void,
        dtype: i32,
        rows: i64,
        d: i64,
        bias: *const c_void,
        stream: Stream,
    ) -> i32;
    pub fn mxa_fp8_quantize(
        x: *const c_void,
        dtype: i32,
        rows: i64,
        rows_p: i64,
        k: i64,
        ldc: i64,
        group: i64,
        codes: *mut u8,
        scales: *mut f32,
        flags: *mut u32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_fp8_quantize_groups(
        x: *const c_void,
        dtype: i32,
        rows: i64,
        rows_p: i64,
        k: i64,
        ldc: i64,
        brows: i64,
        bcols: i64,
        lds: i64,
        amax_bits: *mut u32,
        codes: *mut u8,
        scales: *mut f32,
        flags: *mut u32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_fp8_gemv(
        w: *const u8,
        ldw: i64,
        sw: *const f32,
        x: *const c_void,
        x_dtype: i32,
        ldx: i64,
        sx: *const f32,
        bias: *const f32,
        y: *mut c_void,
        out_dtype: i32,
        t: i64,
        out: i64,
        k: i64,
        stream: Stream,
    ) -> i32;
    pub fn mxa_fp8_dequant(
        w: *const u8,
        ldw: i64,
        rows: i64,
        k: i64,
        dst: *mut c_void,
        dtype: i32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_fp8_epilogue(
        p: *const f32,
        ldp: i64,
        rows: i64,
        cols: i64,
        sw: *const f32,
        sw_ob: i64,
        sw_ostride: i64,
        sx: *const f32,
        acc: *mut f32,
        first: i32,
        last: i32,
        bias: *const f32,
        out: *mut c_void,
        out_dtype: i32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_decode_splits(n: i32) -> i32;
    pub fn mxa_decode_supported(d: i32, hq: i32, hkv: i32, sq: i32) -> i32;
    pub fn mxa_attention_decode(p: *const DecodeParams, stream: Stream) -> i32;
    pub fn mxa_mx_quantize(
        x: *const c_void,
        dtype: i32,
        rows: i64,
        n: i64,
        fmt: i32,
        mode: i32,
        block: i32,
        codes: *mut u8,
        code_stride: i64,
        scales: *mut u8,
        scale_stride: i64,
        stream: Stream,
    ) -> i32;
    pub fn mxa_mx_dequantize(
        codes: *const u8,
        scales: *const u8,
        rows: i64,
        n: i64,
        fmt: i32,
        block: i32,
        out: *mut f32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_attention_prep(
        p: *const AttnParams,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        qp: *mut f32,
        kp: *mut f32,
        vp: *mut f32,
        v_key0: i32,
        v_unscaled: *mut f32,
        vscale: *mut f32,
        bad: *mut i32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_attention_prep_stored(
        p: *const AttnParams,
        is_v: i32,
        codes: *const u8,
        scales: *const u8,
        fmt: i32,
        block: i32,
        n: i32,
        dst: *mut f32,
        bad: *mut i32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_attention_simple(
        p: *const AttnParams,
        qp: *const f32,
        kp: *const f32,
        vp: *const f32,
        out: *mut c_void,
        rollbacks: *mut u64,
        bad: *mut i32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_to_bf16(x: *const f32, y: *mut c_void, n: i64, stream: Stream) -> i32;
    pub fn mxa_attention_mma_supported(p: *const AttnParams) -> i32;
    pub fn mxa_attention_mma(
        p: *const AttnParams,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        vscale: *const f32,
        out: *mut c_void,
        rollbacks: *mut u64,
        bad: *mut i32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_attention_wgmma_supported(p: *const AttnParams) -> i32;
    pub fn mxa_wgmma_available() -> i32;
    pub fn mxa_wgmma_rows_per_cta() -> i32;
    pub fn mxa_wgmma_rows_per_warpgroup() -> i32;
    pub fn mxa_wgmma_keys_per_tile() -> i32;
    pub fn mxa_wgmma_u8_code_check(
        n: i64,
        seed: u32,
        g: f32,
        thr: f32,
        counts: *mut u64,
        stream: Stream,
    ) -> i32;
    pub fn mxa_pack_rows(
        src: *const f32,
        heads: i64,
        rows: i32,
        rows_pad: i32,
        group: i32,
        tile: i32,
        fp8: i32,
        d: i32,
        dst: *mut c_void,
        scales: *mut f32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_pack_vt(
        src: *const f32,
        heads: i64,
        rows: i32,
        rows_pad: i32,
        fp8: i32,
        d: i32,
        chscale: *const f32,
        dst: *mut c_void,
        vscale: *mut f32,
        stream: Stream,
    ) -> i32;
    /// Bit 0: Q and K of this call can be packed straight from the inputs; bit 1: V can.
    pub fn mxa_pack_direct_supported(p: *const AttnParams, fp8: i32) -> i32;
    pub fn mxa_pack_qk_direct(
        p: *const AttnParams,
        src: *const c_void,
        heads: i64,
        rows: i32,
        rows_pad: i32,
        is_q: i32,
        fp8: i32,
        dst: *mut c_void,
        scales: *mut f32,
        bad: *mut i32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_pack_v_direct(
        p: *const AttnParams,
        src: *const c_void,
        rows_pad: i32,
        fp8: i32,
        dst: *mut c_void,
        vscale: *mut f32,
        amax: *mut u32,
        bad: *mut i32,
        stream: Stream,
    ) -> i32;
    pub fn mxa_attention_wgmma(
        p: *const AttnParams,
        q: *const c_void,
        qmul: *const f32,
        k: *const c_void,
        kmul: *const f32,
        vt: *const c_void,
        vscale: *const f32,
        sq_pad: i32,
        sk_pad: i32,
        out: *mut c_void,
        rollbacks: *mut u64,
        bad: *mut i32,
        stream: Stream,
    ) -> i32;
}
