//! The published constants of each Trainium generation the cost model can time a run with, as
//! data, in one table: clocks, data-path widths and performance modes, PE peaks, DMA rates, HBM
//! bandwidth and placement. `Device(timing="trn1" | "trn2" | "trn3")` picks a row; functional
//! behaviour stays NeuronCore-v4 whatever the row. Every number has its source in
//! docs/cost-model.md ("Generation constants"); the ones no document fixes are marked GUESS.

use crate::error::{fail, ErrorKind, Result};

/// One generation's timing constants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Generation {
    /// The `timing=` name: "trn1", "trn2" or "trn3".
    pub name: &'static str,
    /// The NeuronCore version ("NeuronCore-v2" ...), for reports.
    pub core: &'static str,
    /// Engine clocks, GHz.
    pub tensor_ghz: f64,
    pub vector_ghz: f64,
    pub scalar_ghz: f64,
    pub gpsimd_ghz: f64,
    /// Sync sequencer clock, GHz (GUESS: the ScalarE clock; not published).
    pub sync_ghz: f64,
    /// VectorE performance modes of tensor_copy / tensor_scalar / tensor_tensor (v3+).
    pub vector_perf_modes: bool,
    /// ScalarE 2x mode of tensor_copy / tensor_scalar for BF16/FP16 (v4).
    pub scalar_perf_mode: bool,
    /// PE FP8 `double_row` mode: 2x contraction per pass (v3+); without it a double_row matmul
    /// takes two passes.
    pub pe_double_row: bool,
    /// PE MX mode: 4 MACs per PE per cycle for MXFP8/MXFP4 (v4); without it, four passes.
    pub pe_mx: bool,
    /// Published TensorE peaks per core, TFLOPS (reports).
    pub peak_tflops_bf16: f64,
    pub peak_tflops_fp8: f64,
    pub peak_tflops_fp32: f64,
    /// Sparse dense-equivalent peak per core, TFLOPS (0: no sparse matmul published).
    pub peak_tflops_sparse: f64,
    /// Vector / Scalar FP32 peak per core, TFLOPS (reports).
    pub peak_tflops_vector: f64,
    /// Per-DMA-engine bandwidth, bytes/ns (the published peak, reports).
    pub dma_engine_bytes_per_ns: f64,
    /// Fraction of that peak HBM <-> SBUF transfers sustain (1.0: the published per-engine peak;
    /// what small buffers lose comes from the floor below, docs/cost-model.md).
    pub dma_sustained: f64,
    /// Minimum engine time of one DMA buffer, ns (trn2: 108, fitted to anchor I2, the DMA
    /// overview's throughput curve; trn1 and trn3: the same time, GUESS).
    pub dma_descriptor_min_ns: f64,
    /// Device HBM bandwidth, bytes/ns.
    pub hbm_bytes_per_ns: f64,
    /// HBM stacks of the device and NeuronCores of the device.
    pub hbm_stacks: u32,
    pub device_cores: u32,
    /// Chiplets with their own HBM stacks (Trn3: 2 chiplets of 4 cores, each attached to 2 of
    /// the 4 stacks); 1 where the cost model treats every stack as near.
    pub chiplets: usize,
    /// Hardware DGE: issue cost of one DMA instruction on its trigger engine, ns (0: no HWDGE).
    pub hwdge_issue_ns: f64,
}

/// The three generations (reference: ../shared/reference/timing-anchors.md, neuroncore-v4.md).
pub static GENERATIONS: [Generation; 3] = [
    Generation {
        name: "trn1",
        core: "NeuronCore-v2",
        tensor_ghz: 2.8,
        vector_ghz: 1.12,
        scalar_ghz: 1.4,
        gpsimd_ghz: 1.4,
        sync_ghz: 1.4,
        vector_perf_modes: false,
        scalar_perf_mode: false,
        pe_double_row: false,
        pe_mx: false,
        peak_tflops_bf16: 91.75,
        peak_tflops_fp8: 91.75,
        peak_tflops_fp32: 22.94,
        peak_tflops_sparse: 0.0,
        peak_tflops_vector: 0.57,
        dma_engine_bytes_per_ns: 17.0,
        dma_sustained: 1.0,
        dma_descriptor_min_ns: 108.0,
        hbm_bytes_per_ns: 820.0,
        hbm_stacks: 2,
        device_cores: 2,
        chiplets: 1,
        hwdge_issue_ns: 0.0,
    },
    Generation {
        name: "trn2",
        core: "NeuronCore-v3",
        tensor_ghz: 2.4,
        vector_ghz: 0.96,
        scalar_ghz: 1.2,
        gpsimd_ghz: 1.2,
        sync_ghz: 1.2,
        vector_perf_modes: true,
        scalar_perf_mode: false,
        pe_double_row: true,
        pe_mx: false,
        peak_tflops_bf16: 79.0,
        peak_tflops_fp8: 158.0,
        peak_tflops_fp32: 20.0,
        peak_tflops_sparse: 316.0,
        peak_tflops_vector: 1.0,
        dma_engine_bytes_per_ns: 23.0,
        dma_sustained: 1.0,
        dma_descriptor_min_ns: 108.0,
        hbm_bytes_per_ns: 2900.0,
        hbm_stacks: 4,
        device_cores: 8,
        chiplets: 1,
        hwdge_issue_ns: 600.0,
    },
    Generation {
        name: "trn3",
        core: "NeuronCore-v4",
        tensor_ghz: 2.4,
        vector_ghz: 1.2,
        scalar_ghz: 1.2,
        gpsimd_ghz: 1.2,
        sync_ghz: 1.2,
        vector_perf_modes: true,
        scalar_perf_mode: true,
        pe_double_row: true,
        pe_mx: true,
        peak_tflops_bf16: 79.0,
        peak_tflops_fp8: 315.0,
        peak_tflops_fp32: 20.0,
        peak_tflops_sparse: 315.0,
        peak_tflops_vector: 1.2,
        dma_engine_bytes_per_ns: 33.0,
        dma_sustained: 1.0,
        dma_descriptor_min_ns: 108.0,
        hbm_bytes_per_ns: 4700.0,
        hbm_stacks: 4,
        device_cores: 8,
        chiplets: 2,
        hwdge_issue_ns: 600.0,
    },
];

/// The default generation: the emulated chip's own.
pub const DEFAULT: &str = "trn3";

/// Environment variable naming the generation for devices made without an explicit `timing`.
pub const ENV: &str = "TRN3EMU_TIMING";

/// The generation called `name` (case-insensitive; "gen2".."gen4" accepted as aliases).
pub fn generation(name: &str) -> Result<&'static Generation> {
    let key = name.trim().to_ascii_lowercase();
    let key = match key.as_str() {
        "gen2" => "trn1",
        "gen3" => "trn2",
        "gen4" => "trn3",
        k => k,
    };
    GENERATIONS.iter().find(|g| g.name == key).ok_or_else(|| {
        let names: Vec<&str> = GENERATIONS.iter().map(|g| g.name).collect();
        fail(
            ErrorKind::Value,
            "unknown_timing",
            format!(
                "timing {name:?} is not a known generation (one of {})",
                names.join(", ")
            ),
        )
        .operand("timing")
    })
}

/// The default generation's row.
pub fn default_generation() -> &'static Generation {
    &GENERATIONS[2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_and_errors() {
        assert_eq!(generation("TRN1").unwrap().tensor_ghz, 2.8);
        assert_eq!(generation("gen3").unwrap().name, "trn2");
        assert_eq!(default_generation().name, DEFAULT);
        let e = generation("trn9").unwrap_err();
        assert_eq!(e.rule, "unknown_timing");
    }

    #[test]
    fn peaks_follow_the_clocks() {
        for g in &GENERATIONS {
            let bf16 = 128.0 * 128.0 * 2.0 * g.tensor_ghz / 1e3;
            assert!(
                (bf16 - g.peak_tflops_bf16).abs() / bf16 < 0.01,
                "{}",
                g.name
            );
        }
    }
}
