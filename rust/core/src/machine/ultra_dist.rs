//! An UltraServer run spread over several processes (docs/ultraserver.md, "Several
//! processes"): each process owns a set of chips and runs only their schedulers; at the end of
//! every window (machine/ultra.rs) the processes exchange their chips' arrival messages as
//! plain bytes through `exchange` (an allgather the caller provides, e.g. MPI's), and then
//! their next item times (the global minimum bounds the next window). Every process runs the
//! same coordinator on the same arrivals in the same (chip) order, so matching, results and
//! fabric timing are identical in every process and to the single-process run; each process
//! delivers the releases of its own chips. An error in one process is sent to all of them (no
//! process waits for a peer that gave up).

use super::fabric::FabricParams;
use super::ultra::{chip_err, finish, place, start, take_outboxes, Arrival, Placed, UltraResult};
use super::{Device, RunOptions};
use crate::engines::intercore::Snapshot;
use crate::error::{fail, EmuError, ErrorKind::*, Result};

/// An allgather: this process's bytes in, every process's bytes (in process order) out.
pub type Exchange<'a> = dyn FnMut(Vec<u8>) -> Result<Vec<Vec<u8>>> + 'a;

/// Run programs placed on the chips `devs` with this process owning the chips `own` accepts;
/// every process calls it with the same devices' programs and its own `own`. Returns the
/// result with the owned chips' `RunResult`s (others empty) and the whole fabric trace.
pub fn run(
    devs: &mut [&mut Device],
    programs: &[Placed],
    opts: &RunOptions,
    params: FabricParams,
    own: &dyn Fn(usize) -> bool,
    exchange: &mut Exchange,
) -> Result<UltraResult> {
    let by_chip = place(devs.len(), programs)?;
    let r = run_owned(devs, &by_chip, opts, params, own, exchange);
    let mut failed = Ok(());
    for (c, d) in devs.iter_mut().enumerate() {
        if !by_chip[c].is_empty() {
            d.runs += 1;
        }
        failed = failed.and(d.hbm.take_alloc_failure().map_err(chip_err(c)));
    }
    failed.and(r)
}

fn run_owned(
    devs: &mut [&mut Device],
    by_chip: &[Vec<&crate::isa::Program>],
    opts: &RunOptions,
    params: FabricParams,
    own: &dyn Fn(usize) -> bool,
    exchange: &mut Exchange,
) -> Result<UltraResult> {
    let nchips = devs.len();
    let started = start(devs, by_chip, opts, params, own);
    let (mut co, mut scheds) = match started {
        Ok(x) => x,
        Err(e) => {
            let _ = exchange(status(Some(&e)));
            return Err(e);
        }
    };
    let look = params.lookahead_ps();
    let mut next: Vec<Option<u64>> = vec![None; nchips];
    let mut woken: Vec<usize> = (0..nchips).collect();
    loop {
        let mut r = Ok(());
        for &c in &woken {
            if let (Some(s), Ok(())) = (&mut scheds[c], &r) {
                match s.run_until(0) {
                    Ok(x) => next[c] = x,
                    Err(e) => r = Err(chip_err(c)(e)),
                }
            }
        }
        let mine = next.iter().flatten().min().copied();
        let mut msg = status(r.as_ref().err());
        if r.is_ok() {
            msg.extend(mine.unwrap_or(u64::MAX).to_le_bytes());
        }
        let all = checked(exchange(msg)?, r)?;
        let t = all.iter().map(|b| u64_at(b, 1)).min().unwrap_or(u64::MAX);
        if t == u64::MAX {
            break;
        }
        let r = super::ultra::window(&mut scheds, &mut next, t.saturating_add(look));
        let mut msg = status(r.as_ref().err());
        let out = take_outboxes(&mut scheds);
        if r.is_ok() {
            for (c, a) in &out {
                encode(&mut msg, *c, a);
            }
        }
        let all = checked(exchange(msg)?, r)?;
        let mut incoming = Vec::new();
        for b in &all {
            decode_all(&b[1..], &mut incoming)?;
        }
        // Chip order, as in one process (each chip's arrivals keep their order).
        incoming.sort_by_key(|(c, _)| *c);
        if let Some((c, _)) = incoming.iter().find(|(_, a)| a.snap.deferred) {
            return Err(fail(
                Value,
                "ultra_dist_in_place_all_to_all",
                format!("chip {c}: an in-place all_to_all (dst = src) across processes is not supported; use a separate dst"),
            ));
        }
        woken = co.exchange(incoming, by_chip, &mut scheds)?;
    }
    co.check_done(&scheds)?;
    Ok(finish(scheds, co))
}

/// A message's first byte: 0 ok, 1 this process failed (its error text follows).
fn status(e: Option<&EmuError>) -> Vec<u8> {
    match e {
        None => vec![0],
        Some(e) => {
            let mut v = vec![1];
            v.extend(e.message.as_bytes());
            v
        }
    }
}

/// This process's own error first, else the first failed peer's, else the messages.
fn checked(all: Vec<Vec<u8>>, mine: Result<()>) -> Result<Vec<Vec<u8>>> {
    mine?;
    for (p, b) in all.iter().enumerate() {
        if b.first() != Some(&0) {
            let text = String::from_utf8_lossy(b.get(1..).unwrap_or(&[]));
            return Err(fail(
                Distributed,
                "ultra_dist_peer_failed",
                format!("process {p} of the distributed UltraServer run failed: {text}"),
            ));
        }
    }
    Ok(all)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|x| x.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(u64::MAX)
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend((b.len() as u64).to_le_bytes());
    out.extend(b);
}

/// One arrival as bytes: chip, core, agent, idx, time, vc, group, snapshot.
fn encode(out: &mut Vec<u8>, chip: usize, a: &Arrival) {
    out.extend((chip as u64).to_le_bytes());
    out.push(a.core);
    out.extend((a.agent as u64).to_le_bytes());
    out.extend(a.idx.to_le_bytes());
    out.extend(a.time.to_le_bytes());
    let vc: Vec<u8> = a.vc.iter().flat_map(|x| x.to_le_bytes()).collect();
    put_bytes(out, &vc);
    let g: Vec<u8> = a.group.iter().flat_map(|x| x.to_le_bytes()).collect();
    put_bytes(out, &g);
    put_bytes(out, &a.snap.src);
    let counts: Vec<u8> = a.snap.counts.iter().flat_map(|x| x.to_le_bytes()).collect();
    put_bytes(out, &counts);
    put_bytes(out, &a.snap.dst);
    out.push(a.snap.deferred as u8);
}

struct Reader<'b>(&'b [u8]);

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8]> {
        if self.0.len() < n {
            return Err(fail(
                Internal,
                "ultra_dist_message_truncated",
                "a distributed UltraServer message ended early",
            ));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64_at(self.take(8)?, 0))
    }
    fn bytes(&mut self) -> Result<&'b [u8]> {
        let n = self.u64()? as usize;
        self.take(n)
    }
}

fn decode_all(mut b: &[u8], out: &mut Vec<(usize, Arrival)>) -> Result<()> {
    while !b.is_empty() {
        let mut r = Reader(b);
        let chip = r.u64()? as usize;
        let core = r.take(1)?[0];
        let agent = r.u64()? as usize;
        let idx = u32::from_le_bytes(r.take(4)?.try_into().unwrap_or_default());
        let time = r.u64()?;
        let vc = r.bytes()?.chunks_exact(4);
        let vc = vc
            .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
            .collect();
        let g = r.bytes()?.chunks_exact(2);
        let group = g.map(|x| u16::from_le_bytes([x[0], x[1]])).collect();
        let src = r.bytes()?.to_vec();
        let counts = r.bytes()?.chunks_exact(8);
        let counts = counts.map(|x| u64_at(x, 0) as i64).collect();
        let dst = r.bytes()?.to_vec();
        let deferred = r.take(1)?[0] != 0;
        let snap = Snapshot {
            src,
            counts,
            dst,
            deferred,
        };
        out.push((
            chip,
            Arrival {
                core,
                agent,
                idx,
                time,
                vc,
                snap,
                group,
            },
        ));
        b = r.0;
    }
    Ok(())
}
