//! Access patterns: the one way instructions touch memory.
//!
//! An AP names `parts` rows (SBUF/PSUM partitions starting at `start`, or HBM rows `pstep`
//! elements apart) and, in every row, the same free-dim pattern: up to 4 `(step, num)` pairs in
//! elements, outer to inner, starting `offset` bytes into the row (on-chip) or into HBM.

use super::{Mem, HBM_BYTES, PARTITIONS, PSUM_BANK_BYTES, PSUM_PART_BYTES, SBUF_PART_BYTES};
use crate::error::{fail, ErrorKind::*, Result};
use crate::isa::DType;

pub const MAX_FREE_DIMS: usize = 4;
/// Elements one row of an access pattern may name (2^26; a full SBUF partition holds 2^18 bytes,
/// larger counts only arise from broadcast steps or HBM rows). An emulator limit, not hardware's.
pub const MAX_ROW_ELEMENTS: u128 = 1 << 26;
/// Elements one access pattern may name in all (2^30, e.g. a 4 GiB fp32 HBM tensor).
pub const MAX_ELEMENTS: u128 = 1 << 30;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ap {
    pub mem: Mem,
    pub dtype: DType,
    /// First partition (on-chip); 0 for HBM.
    pub start: u32,
    /// Partitions (on-chip) or rows (HBM).
    pub parts: u32,
    /// HBM only: elements between rows. On-chip rows are partitions.
    pub pstep: i64,
    /// Byte offset within each partition (on-chip) or byte address (HBM).
    pub offset: u64,
    /// Free dims, outer to inner: (step in elements, count).
    pub dims: Vec<(i64, u32)>,
    /// A runtime (register- or tile-valued) offset; `None` for static patterns.
    pub dynamic: Option<Box<Dynamic>>,
}

/// Where a dynamic offset comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DynSrc {
    /// A sequencer register of the issuing engine (read when the instruction issues).
    Reg(u8),
    /// An int32/uint32 tile (read when the instruction executes): 1x1 for scalar offsets,
    /// (P, K) for vector offsets (row r uses `tile[r % P, r / P]`).
    Tile(Ap),
}

/// How a dynamic offset moves the pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DynKind {
    /// `scalar_offset`: the whole pattern moves by `value * step` elements.
    Scalar,
    /// `vector_offset`: row r starts at `index[r] * step` elements from the base (HBM only).
    Vector,
    /// v4 tensor indirection (`t.indirect(index)`, compute operands): element i of every row
    /// is at `index_i * step` elements from the base, `index_i = tile[i % G, i / G]` (G = 16 on
    /// Vector/Scalar/GpSimd, 32 on Tensor). The pattern has one free dim of the view's length.
    Indirect,
    /// An indirect pattern after its index tile was read: explicit element offsets `cols[i] *
    /// step` (transient, only inside an executing instruction; never encoded).
    Columns,
}

/// A runtime offset: `kind`, its source, the element step per index unit, and the number of
/// valid index values (`0..bound`, the extent of the indexed dim of the base tensor). Statically
/// the access may touch any index in `0..bound`; race detection and auto-sync assume all of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dynamic {
    pub kind: DynKind,
    pub src: DynSrc,
    pub step: i64,
    pub bound: u32,
    /// `Columns` only: the resolved column indices.
    pub cols: Vec<i64>,
}

impl Ap {
    /// Elements per row.
    pub fn free_size(&self) -> usize {
        self.dims.iter().map(|d| d.1 as usize).product()
    }

    pub fn num_elements(&self) -> usize {
        self.parts as usize * self.free_size()
    }

    /// Logical shape: (rows, free dims...).
    pub fn shape(&self) -> Vec<usize> {
        let mut s = vec![self.parts as usize];
        s.extend(self.dims.iter().map(|d| d.1 as usize));
        s
    }

    /// Resolved indirect columns, if this is one.
    fn columns(&self) -> Option<&Dynamic> {
        self.dynamic
            .as_deref()
            .filter(|d| d.kind == DynKind::Columns)
    }

    /// Element offsets (relative to the row start) of one row, in logical order.
    pub fn row_offsets(&self) -> Vec<i64> {
        if let Some(d) = self.columns() {
            return d.cols.iter().map(|c| c * d.step).collect();
        }
        let mut offs = Vec::with_capacity(self.free_size());
        self.push_offsets(&mut offs);
        offs
    }

    /// `row_offsets` whose buffer may fail to allocate (a `Resource` error, not an abort): for
    /// HBM patterns, whose rows are not bounded by on-chip memory (8 bytes per element: twice
    /// a 4-byte element's staging buffer).
    pub fn try_row_offsets(&self) -> crate::error::Result<Vec<i64>> {
        if let Some(d) = self.columns() {
            let mut v = crate::error::try_vec(0, 0i64, "a DMA pattern's offsets")?;
            crate::error::try_extend(&mut v, d.cols.len(), "a DMA pattern's offsets")?;
            v.extend(d.cols.iter().map(|c| c * d.step));
            return Ok(v);
        }
        let mut offs = Vec::new();
        crate::error::try_extend(&mut offs, self.free_size(), "a DMA pattern's offsets")?;
        self.push_offsets(&mut offs);
        Ok(offs)
    }

    /// Append the row's offsets (odometer order: the last dim fastest) to `offs`, which has
    /// room for them (no reallocation).
    fn push_offsets(&self, offs: &mut Vec<i64>) {
        let start = offs.len();
        offs.push(0);
        for &(step, num) in &self.dims {
            // Expand in place from the back: entry k becomes entries k*num..(k+1)*num.
            let have = offs.len() - start;
            let num = num as usize;
            if num == 0 {
                offs.truncate(start);
                return;
            }
            offs.resize(start + have * num, 0);
            for k in (0..have).rev() {
                let o = offs[start + k];
                for i in (0..num).rev() {
                    offs[start + k * num + i] = o + i as i64 * step;
                }
            }
        }
    }

    /// Min and max element offset within a row.
    pub fn row_extent(&self) -> (i64, i64) {
        if let Some(d) = self.columns() {
            let it = d.cols.iter().map(|c| c * d.step);
            return (it.clone().min().unwrap_or(0), it.max().unwrap_or(0));
        }
        let (mut lo, mut hi) = (0i64, 0i64);
        for &(step, num) in &self.dims {
            let span = step * (num as i64 - 1);
            if span < 0 {
                lo += span;
            } else {
                hi += span;
            }
        }
        (lo, hi)
    }

    /// Byte address of row `r` (partition base for on-chip, absolute for HBM).
    pub fn row_base(&self, r: u32) -> i128 {
        match self.mem {
            Mem::Hbm => {
                self.offset as i128 + r as i128 * self.pstep as i128 * self.dtype.size() as i128
            }
            _ => self.offset as i128,
        }
    }

    /// Bytes touched per row, as an inclusive-exclusive range relative to the row base.
    pub fn row_byte_range(&self) -> (i128, i128) {
        let (lo, hi) = self.row_extent();
        let s = self.dtype.size() as i128;
        (lo as i128 * s, (hi as i128 + 1) * s)
    }

    /// The static pattern with the dynamic offset fixed at `index` (scalar) or every row at
    /// `index` (vector); used for bounds and footprints over the whole index range.
    pub fn at_index(&self, index: i64) -> Result<Ap> {
        let mut a = self.clone();
        if let Some(d) = self.dynamic.as_deref() {
            let delta = index as i128 * d.step as i128 * self.dtype.size() as i128;
            let off = self.offset as i128 + delta;
            if !(0..=u64::MAX as i128).contains(&off) {
                return Err(fail(
                    Address,
                    "dynamic_offset_overflow",
                    format!("dynamic index {index} moves the pattern to byte offset {off}"),
                ));
            }
            a.offset = off as u64;
            if d.kind == DynKind::Vector {
                a.pstep = 0;
            }
            if d.kind == DynKind::Indirect {
                a.dims = vec![(d.step, 1)];
            }
        }
        a.dynamic = None;
        Ok(a)
    }

    /// Check shape, bounds and the row geometry of the memory. Independent of the instruction.
    /// A dynamic pattern must be in bounds for every index in `0..bound`.
    pub fn check_bounds(&self) -> Result<()> {
        if let Some(d) = self.dynamic.as_deref() {
            return self.check_dynamic(d);
        }
        if self.dims.is_empty() || self.dims.len() > MAX_FREE_DIMS {
            return Err(fail(
                Shape,
                "ap_free_dims",
                format!(
                    "access pattern needs 1..={MAX_FREE_DIMS} free dims, got {}",
                    self.dims.len()
                ),
            ));
        }
        if self.parts == 0 || self.dims.iter().any(|d| d.1 == 0) {
            return Err(fail(
                Shape,
                "ap_empty_dim",
                "access pattern has an empty dimension",
            ));
        }
        let free: u128 = self.dims.iter().map(|d| d.1 as u128).product();
        if free > MAX_ROW_ELEMENTS || free * self.parts as u128 > MAX_ELEMENTS {
            return Err(fail(
                Shape,
                "ap_too_large",
                format!(
                    "access pattern of {} x {free} elements exceeds the emulator's limits ({MAX_ROW_ELEMENTS} per row, {MAX_ELEMENTS} in all)",
                    self.parts
                ),
            ));
        }
        // Fields the other memory kind has no use for must be zero (text and binary omit them).
        if self.mem == Mem::Hbm && self.start != 0 {
            return Err(fail(
                Address,
                "hbm_start_partition",
                format!(
                    "HBM access pattern with start partition {} (HBM has no partitions)",
                    self.start
                ),
            ));
        }
        if self.mem != Mem::Hbm && self.pstep != 0 {
            return Err(fail(
                Shape,
                "onchip_row_step",
                format!(
                    "on-chip access pattern with row step {} (partitions are the rows)",
                    self.pstep
                ),
            ));
        }
        // Extents in i128: i64 step * count can overflow and wrap into range.
        let (mut elo, mut ehi) = (0i128, 0i128);
        for &(step, num) in &self.dims {
            let span = step as i128 * (num as i128 - 1);
            if span < 0 {
                elo += span;
            } else {
                ehi += span;
            }
        }
        let s = self.dtype.size() as i128;
        let (blo, bhi) = (elo * s, (ehi + 1) * s);
        match self.mem {
            Mem::Sbuf | Mem::Psum => self.check_onchip_extent(blo, bhi),
            Mem::Hbm => self.check_hbm_extent(blo, bhi),
        }
    }

    /// Partitions and per-partition bytes (`blo..bhi` relative to `offset`) of an on-chip pattern.
    fn check_onchip_extent(&self, blo: i128, bhi: i128) -> Result<()> {
        let limit = if self.mem == Mem::Sbuf {
            SBUF_PART_BYTES
        } else {
            PSUM_PART_BYTES
        } as i128;
        if self.start as u64 + self.parts as u64 > PARTITIONS as u64 {
            return Err(fail(
                Address,
                "partition_out_of_range",
                format!(
                    "partitions {}..{} exceed the {} partitions of {}",
                    self.start,
                    self.start as u64 + self.parts as u64,
                    PARTITIONS,
                    self.mem.name()
                ),
            ));
        }
        let lo = self.offset as i128 + blo;
        let hi = self.offset as i128 + bhi;
        if lo < 0 || hi > limit {
            return Err(fail(
                Address,
                "partition_bytes_out_of_range",
                format!(
                    "bytes {lo}..{hi} of each partition are outside {} ({} bytes per partition)",
                    self.mem.name(),
                    limit
                ),
            ));
        }
        if !self.offset.is_multiple_of(self.dtype.size() as u64) {
            return Err(fail(
                Address,
                "offset_misaligned",
                format!(
                    "offset {} is not aligned to {} ({} bytes)",
                    self.offset,
                    self.dtype.name(),
                    self.dtype.size()
                ),
            ));
        }
        Ok(())
    }

    /// HBM bytes (`blo..bhi` of each row relative to its base) inside the address space.
    fn check_hbm_extent(&self, blo: i128, bhi: i128) -> Result<()> {
        let rows = self.parts as i128 - 1;
        let rstep = self.pstep as i128 * self.dtype.size() as i128;
        let (rlo, rhi) = if rstep < 0 {
            (rows * rstep, 0)
        } else {
            (0, rows * rstep)
        };
        let lo = self.offset as i128 + rlo + blo;
        let hi = self.offset as i128 + rhi + bhi;
        if lo < 0 || hi > HBM_BYTES as i128 {
            return Err(fail(
                Address,
                "hbm_out_of_range",
                format!("HBM bytes {lo}..{hi} are outside the 144 GiB address space"),
            ));
        }
        Ok(())
    }

    fn check_dynamic(&self, d: &Dynamic) -> Result<()> {
        if d.bound == 0 {
            return Err(fail(
                Shape,
                "dynamic_bound_zero",
                "dynamic offset bound must be at least 1",
            ));
        }
        if d.kind == DynKind::Columns {
            return Err(fail(
                Value,
                "resolved_columns_not_encodable",
                "resolved indirect columns are not an encodable pattern",
            ));
        }
        if d.kind == DynKind::Indirect && (self.mem == Mem::Hbm || self.dims.len() != 1) {
            return Err(fail(
                Shape,
                "indirect_view_shape",
                "tensor indirection views an on-chip tensor as (P, num_elem): one free dim",
            ));
        }
        if d.kind == DynKind::Vector && self.mem != Mem::Hbm {
            return Err(fail(
                MemorySpace,
                "vector_offset_needs_hbm",
                "vector_offset indexes an HBM tensor (the indexed tensor must be in HBM)",
            ));
        }
        if let DynSrc::Tile(t) = &d.src {
            if t.dynamic.is_some() {
                return Err(fail(
                    Value,
                    "nested_dynamic_offset",
                    "a dynamic-offset tile cannot itself be dynamic",
                ));
            }
            t.check_bounds()?;
            if t.mem == Mem::Psum {
                return Err(fail(
                    MemorySpace,
                    "offset_tile_in_psum",
                    "offset tiles live in SBUF or HBM, not PSUM",
                ));
            }
            // Tensor indirection also takes uint16 offsets: the vendor's TI tutorial builds its
            // index tile as uint16 (the API docs name no index dtype).
            let uint16_ti = d.kind == DynKind::Indirect && t.dtype == DType::Uint16;
            if !matches!(t.dtype, DType::Int32 | DType::Uint32) && !uint16_ti {
                return Err(fail(
                    Dtype,
                    "offset_tile_dtype",
                    format!(
                        "offset tile must be int32 or uint32 (uint16 also for tensor indirection), got {}",
                        t.dtype.name()
                    ),
                ));
            }
            match d.kind {
                DynKind::Scalar if t.num_elements() != 1 => {
                    return Err(fail(
                        Shape,
                        "scalar_offset_tile_shape",
                        format!("scalar_offset tile must be 1x1, got {:?}", t.shape()),
                    ))
                }
                DynKind::Vector | DynKind::Indirect if t.mem != Mem::Sbuf => {
                    return Err(fail(MemorySpace, "index_tile_not_sbuf", "index tiles must be in SBUF"))
                }
                DynKind::Indirect if !t.start.is_multiple_of(32) => {
                    return Err(fail(
                        Partition,
                        "indirect_index_quadrant",
                        format!(
                            "an indirection index view starts on a quadrant boundary (0/32/64/96), not partition {}",
                            t.start
                        ),
                    ))
                }
                DynKind::Vector if (t.num_elements() as u64) < self.parts as u64 => {
                    return Err(fail(
                        Shape,
                        "vector_offset_tile_too_small",
                        format!(
                            "vector_offset index tile {:?} has fewer than the {} rows it indexes",
                            t.shape(),
                            self.parts
                        ),
                    ))
                }
                _ => {}
            }
        } else if matches!(d.kind, DynKind::Vector | DynKind::Indirect) {
            return Err(fail(
                Value,
                "index_needs_tile",
                "vector_offset / indirect need an index tile, not a register",
            ));
        }
        self.at_index(0)?.check_bounds()?;
        self.at_index(d.bound as i64 - 1)?.check_bounds()
    }

    /// The start-partition rule for compute engines: >64 partitions start at 0, 33..64 at 0 or
    /// 64, 1..32 at a multiple of 32 (quadrant boundary).
    pub fn check_start_partition(&self) -> Result<()> {
        if self.mem == Mem::Hbm {
            return Ok(());
        }
        let ok = match self.parts {
            0..=32 => self.start.is_multiple_of(32),
            33..=64 => self.start == 0 || self.start == 64,
            _ => self.start == 0,
        };
        if ok {
            Ok(())
        } else {
            Err(fail(
                Partition,
                "start_partition",
                format!(
                    "start partition {} is not allowed for {} partitions (start-partition rule: >64 start at 0, 33..64 at 0 or 64, <=32 at 0/32/64/96)",
                    self.start, self.parts
                ),
            ))
        }
    }

    /// TensorE PSUM writes: a result that is not bank-aligned must fit in one 2 KiB bank.
    pub fn check_psum_bank(&self) -> Result<()> {
        if self.mem != Mem::Psum {
            return Ok(());
        }
        let (blo, bhi) = self.row_byte_range();
        let lo = self.offset as i128 + blo;
        let hi = self.offset as i128 + bhi;
        let bank = PSUM_BANK_BYTES as i128;
        if lo % bank != 0 && lo / bank != (hi - 1) / bank {
            return Err(fail(
                PsumBank,
                "psum_bank_crossing",
                format!(
                    "PSUM bytes {lo}..{hi} cross a 2 KiB bank boundary without starting on one (bank {} to {})",
                    lo / bank,
                    (hi - 1) / bank
                ),
            ));
        }
        Ok(())
    }

    /// True when each row is one contiguous run (innermost-first dense).
    pub fn is_row_contiguous(&self) -> bool {
        if self.columns().is_some() {
            return false;
        }
        let mut expect = 1i64;
        for &(step, num) in self.dims.iter().rev() {
            if num > 1 && step != expect {
                return false;
            }
            expect *= num as i64;
        }
        true
    }

    /// Merged contiguous byte runs of one row (relative to the row base), sorted, for overlap tests.
    pub fn row_runs(&self) -> Vec<(i128, i128)> {
        let s = self.dtype.size() as i128;
        if self.is_row_contiguous() {
            return vec![(0, self.free_size() as i128 * s)];
        }
        let mut offs = self.row_offsets();
        offs.sort_unstable();
        offs.dedup();
        let mut runs: Vec<(i128, i128)> = Vec::new();
        for o in offs {
            let (a, b) = (o as i128 * s, (o as i128 + 1) * s);
            match runs.last_mut() {
                Some(last) if last.1 >= a => last.1 = last.1.max(b),
                _ => runs.push((a, b)),
            }
        }
        runs
    }
}
