//! CUDA backend: the Rust side of `kernels/*.cu` (launch, layouts, dtype dispatch).

pub(crate) mod attention;
pub(crate) mod decode;
pub(crate) mod ffi;
pub(crate) mod fused;
pub(crate) mod mx;
