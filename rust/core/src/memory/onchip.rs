//! SBUF and PSUM of one core: `PARTITIONS` rows of `part_bytes`, partition-major.

use super::{Ap, Mem, PARTITIONS, PSUM_PART_BYTES, SBUF_PART_BYTES};
use crate::memory::hbm::Hbm;

pub struct OnChip {
    pub part_bytes: usize,
    pub bytes: Vec<u8>,
}

impl OnChip {
    pub fn new(part_bytes: usize) -> Self {
        OnChip {
            part_bytes,
            bytes: vec![0u8; part_bytes * PARTITIONS],
        }
    }
    pub fn sbuf() -> Self {
        Self::new(SBUF_PART_BYTES)
    }
    pub fn psum() -> Self {
        Self::new(PSUM_PART_BYTES)
    }
    pub fn fill(&mut self, byte: u8) {
        self.bytes.fill(byte);
    }
}

/// Mutable view of the memories one instruction of one core can reach.
pub struct Mems<'a> {
    pub sbuf: &'a mut OnChip,
    pub psum: &'a mut OnChip,
    pub hbm: &'a mut Hbm,
}

impl Mems<'_> {
    fn onchip(&self, m: Mem) -> &OnChip {
        match m {
            Mem::Sbuf => self.sbuf,
            _ => self.psum,
        }
    }

    /// Read the elements of a (validated) AP in logical order as packed little-endian bytes.
    pub fn gather(&self, ap: &Ap) -> Vec<u8> {
        let es = ap.dtype.size();
        let f = ap.free_size();
        let mut out = vec![0u8; ap.parts as usize * f * es];
        let contiguous = ap.is_row_contiguous();
        let offs = if contiguous {
            Vec::new()
        } else {
            ap.row_offsets()
        };
        for r in 0..ap.parts {
            let dst = &mut out[r as usize * f * es..(r as usize + 1) * f * es];
            match ap.mem {
                Mem::Hbm => {
                    let base = ap.row_base(r) as u64;
                    if contiguous {
                        self.hbm.read(base, dst);
                    } else {
                        for (i, o) in offs.iter().enumerate() {
                            self.hbm.read(
                                (base as i128 + *o as i128 * es as i128) as u64,
                                &mut dst[i * es..(i + 1) * es],
                            );
                        }
                    }
                }
                m => {
                    let mem = self.onchip(m);
                    let base = (ap.start + r) as usize * mem.part_bytes + ap.offset as usize;
                    if contiguous {
                        dst.copy_from_slice(&mem.bytes[base..base + f * es]);
                    } else {
                        for (i, o) in offs.iter().enumerate() {
                            let a = (base as i64 + o * es as i64) as usize;
                            dst[i * es..(i + 1) * es].copy_from_slice(&mem.bytes[a..a + es]);
                        }
                    }
                }
            }
        }
        out
    }

    /// Write packed little-endian bytes to the elements of a (validated) AP in logical order.
    pub fn scatter(&mut self, ap: &Ap, data: &[u8]) {
        let es = ap.dtype.size();
        let f = ap.free_size();
        let contiguous = ap.is_row_contiguous();
        let offs = if contiguous {
            Vec::new()
        } else {
            ap.row_offsets()
        };
        for r in 0..ap.parts {
            let src = &data[r as usize * f * es..(r as usize + 1) * f * es];
            match ap.mem {
                Mem::Hbm => {
                    let base = ap.row_base(r) as u64;
                    if contiguous {
                        self.hbm.write(base, src);
                    } else {
                        for (i, o) in offs.iter().enumerate() {
                            self.hbm.write(
                                (base as i128 + *o as i128 * es as i128) as u64,
                                &src[i * es..(i + 1) * es],
                            );
                        }
                    }
                }
                m => {
                    let mem = match m {
                        Mem::Sbuf => &mut *self.sbuf,
                        _ => &mut *self.psum,
                    };
                    let base = (ap.start + r) as usize * mem.part_bytes + ap.offset as usize;
                    if contiguous {
                        mem.bytes[base..base + f * es].copy_from_slice(src);
                    } else {
                        for (i, o) in offs.iter().enumerate() {
                            let a = (base as i64 + o * es as i64) as usize;
                            mem.bytes[a..a + es].copy_from_slice(&src[i * es..(i + 1) * es]);
                        }
                    }
                }
            }
        }
    }
}
