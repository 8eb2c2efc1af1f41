//! Automatic synchronisation: insert the semaphore waits and signals that a program's data
//! dependencies require (RAW, WAR and WAW between different streams or DMA queues), and no
//! others that are implied already. The result is race-free by construction and keeps engines
//! as concurrent as the dependencies allow.
//!
//! One semaphore per ordered (producer executor, consumer stream) pair, counting signals:
//! semaphores `AUTO_SEM_BASE..AUTO_SEM_BASE + AUTO_SEMS` (50) are reserved for this pass.

use super::region::{conflict, regions_into, Region};
use super::{Executor, Stream, AGENTS_PER_CORE, NUM_STREAMS};
use crate::error::{fail, ErrorKind::Interrupted, ErrorKind::Semaphore, ErrorKind::Value, Result};
use crate::isa::instr::MAX_SYNC;
use crate::isa::validate::is_dma;
use crate::isa::{Program, Signal, Wait};

pub const AUTO_SEM_BASE: u16 = 200;
/// Semaphores reserved for this pass: one per (producer executor, consumer stream) pair.
pub const AUTO_SEMS: u16 = (AGENTS_PER_CORE * NUM_STREAMS) as u16;
const N: usize = AGENTS_PER_CORE;

/// The semaphore counting signals from executor `producer` (an index) to stream `consumer`.
fn auto_sem(producer: usize, consumer: Stream) -> u16 {
    AUTO_SEM_BASE + (producer * NUM_STREAMS + consumer.index()) as u16
}
/// What one executor knows of every executor's progress (positions).
type Clock = [u32; N];

struct Entry {
    pos: u32,
    instr: usize,
    clock: [u32; N],
    /// The instruction's regions: `regions[from..to]` of the pass's one list.
    from: usize,
    to: usize,
}

/// Programs with `branch` are refused (a conservative rule: the signal counts this pass computes
/// assume each instruction runs once); synchronise them manually. Race detection still checks them.
pub fn auto_sync(prog: &Program) -> Result<Program> {
    auto_sync_checked(prog, &mut || true)
}

/// Instructions between two calls of `auto_sync_checked`'s `keep_going`.
pub const CHECK_EVERY: usize = 4096;

/// `auto_sync`, asking `keep_going` every `CHECK_EVERY` instructions whether to go on (false:
/// an `Interrupted` error, rule `interrupted`).
pub fn auto_sync_checked(prog: &Program, keep_going: &mut dyn FnMut() -> bool) -> Result<Program> {
    check_input(prog)?;
    // Copied instruction by instruction as the pass goes (it only adds to instructions at or
    // before the current one): a copy made up front (800k instructions: ~0.5 s), or dropped
    // whole on cancel, could not be interrupted.
    let mut out = Program {
        core: prog.core,
        instrs: Vec::with_capacity(prog.instrs.len()),
    };
    let mut know = [[0u32; N]; N];
    let mut pos = [0u32; N];
    let mut logs: Vec<Vec<Entry>> = (0..N).map(|_| Vec::new()).collect();
    // Every instruction's regions, one after the other (one list, not one per instruction).
    let mut all: Vec<Region> = Vec::with_capacity(3 * prog.instrs.len());
    // Per (producer, consumer stream): signal count, and the position and clock of the last signaler.
    let mut sig_count = [[0u32; NUM_STREAMS]; N];
    let mut last_sig: [[Option<(u32, Clock)>; NUM_STREAMS]; N] = [[None; NUM_STREAMS]; N];
    for i in 0..prog.instrs.len() {
        if i % CHECK_EVERY == CHECK_EVERY - 1 && !keep_going() {
            return Err(cancelled(i));
        }
        out.instrs.push(prog.instrs[i].clone());
        // The issuing stream `w` and the executor `x` that performs the access (a DMA's queue).
        let stream = Stream::of(out.instrs[i].engine);
        let w = stream.index();
        let dma = is_dma(&out.instrs[i]);
        let x = if dma {
            Executor::DmaQueue(stream)
        } else {
            Executor::Engine(stream)
        }
        .index();
        let from = all.len();
        regions_into(prog.core, &out.instrs[i], &mut all);
        let regs = &all[from..];
        if !regs.is_empty() {
            for y in 0..N {
                if y == x {
                    continue;
                }
                let exec_know =
                    |k: &[[u32; N]; N]| if dma { k[x][y].max(k[w][y]) } else { k[x][y] };
                let known = exec_know(&know);
                // Newest unordered conflicting access of y.
                let hit = logs[y]
                    .iter()
                    .rev()
                    .take_while(|e| e.pos > known)
                    .find(|e| conflict(regs, &all[e.from..e.to]).is_some());
                let Some(e) = hit else { continue };
                let (epos, einstr, eclock) = (e.pos, e.instr, e.clock);
                // Wait on the latest signaler at or after e, adding a signal to e if there is none.
                let (value, clock) = match last_sig[y][w] {
                    Some((spos, sclock)) if spos >= epos => (sig_count[y][w], sclock),
                    _ => {
                        sig_count[y][w] += 1;
                        last_sig[y][w] = Some((epos, eclock));
                        out.instrs[einstr].signals.push(Signal {
                            sem: auto_sem(y, stream),
                            delta: 1,
                        });
                        (sig_count[y][w], eclock)
                    }
                };
                out.instrs[i].waits.push(Wait {
                    sem: auto_sem(y, stream),
                    value,
                });
                for k in 0..N {
                    know[w][k] = know[w][k].max(clock[k]);
                }
            }
        }
        // Execute: the stream advances; a DMA's transfer inherits the issuer's knowledge.
        pos[w] += 1;
        know[w][w] = pos[w];
        if dma {
            pos[x] += 1;
            let kw = know[w];
            for k in 0..N {
                know[x][k] = know[x][k].max(kw[k]);
            }
            know[x][x] = pos[x];
        }
        if all.len() > from {
            logs[x].push(Entry {
                pos: pos[x],
                instr: i,
                clock: know[x],
                from,
                to: all.len(),
            });
        }
    }
    check_output(&out)?;
    Ok(out)
}

/// The error of a pass its caller cancelled at instruction `i`.
pub fn cancelled(i: usize) -> crate::error::EmuError {
    fail(
        Interrupted,
        "interrupted",
        format!("automatic synchronisation cancelled by its caller at instruction {i}"),
    )
}

/// The pass refuses programs with branches and programs that use its reserved semaphores.
fn check_input(prog: &Program) -> Result<()> {
    if super::control::has_branches(prog) {
        return Err(fail(
            Value,
            "autosync_with_branches",
            "automatic synchronisation does not handle runtime control flow (branch): use sync='manual' and explicit semaphores",
        ));
    }
    for ins in &prog.instrs {
        if ins
            .waits
            .iter()
            .map(|w| w.sem)
            .chain(ins.signals.iter().map(|s| s.sem))
            .any(|s| (AUTO_SEM_BASE..AUTO_SEM_BASE + AUTO_SEMS).contains(&s))
        {
            return Err(fail(
                Semaphore,
                "autosync_reserved_semaphore",
                format!(
                    "semaphores {}..{} are reserved for automatic synchronisation",
                    AUTO_SEM_BASE,
                    AUTO_SEM_BASE + AUTO_SEMS
                ),
            ));
        }
    }
    Ok(())
}

/// Every instruction of the result still fits the per-instruction wait and signal limits.
fn check_output(out: &Program) -> Result<()> {
    for (i, ins) in out.instrs.iter().enumerate() {
        if ins.waits.len() > MAX_SYNC || ins.signals.len() > MAX_SYNC {
            return Err(fail(
                Semaphore,
                "autosync_too_many_sync",
                format!(
                    "with the automatic semaphores this instruction has {} waits and {} signals (at most {MAX_SYNC} each)",
                    ins.waits.len(),
                    ins.signals.len()
                ),
            )
            .at(i, crate::isa::text::format_instr(ins)));
        }
    }
    Ok(())
}
