//! Host-speed kernels behind the engines' instruction semantics: the same documented
//! arithmetic as the engine modules state, organised for SIMD and threads. Nothing here
//! decides semantics; every kernel is bit-identical across SIMD paths and thread counts.

pub mod checked;
pub mod decode;
pub mod exp;
#[cfg(target_arch = "x86_64")]
pub mod exp_avx2;
#[cfg(target_arch = "x86_64")]
pub mod exp_avx512;
mod exp_f32;
mod exp_portable;
#[cfg(test)]
mod exp_ref;
#[cfg(target_arch = "x86_64")]
mod exp_x86;
pub mod gemm;
pub mod log;
#[cfg(target_arch = "x86_64")]
pub mod log_avx2;
#[cfg(target_arch = "x86_64")]
pub mod log_avx512;
#[cfg(target_arch = "x86_64")]
pub mod log_f32;
pub mod matmul;
pub mod minmax;
pub mod mx;
pub mod psum;
pub mod quantize;
pub mod rowsum;
pub mod rsqrt;
#[cfg(target_arch = "x86_64")]
pub mod rsqrt_avx2;
#[cfg(target_arch = "x86_64")]
pub mod rsqrt_avx512;
pub mod simd;
pub mod sparse;
pub mod transpose;
