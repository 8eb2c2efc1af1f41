//! An UltraServer run spread over several processes (docs/ultraserver.md, "Several
//! processes"): each process owns a set of chips and runs only their schedulers. At the end of
//! every window (machine/ultra.rs) the processes exchange their next item times (the global
//! minimum bounds the next window) and their chips' arrival messages *without data* (chip,
//! core, instruction, time, clock, group, the byte lengths: `part::Meta`). Every process runs
//! the same matching, checks and fabric timing on the same arrivals in the same (chip) order,
//! so errors and times are identical everywhere and to the single-process run. The data then
//! moves point to point: for every completed group, each process sends each peer only the
//! bytes of its own ranks' srcs (or, for an in-place all_to_all, of their buffers) that the
//! peer's ranks consume (`Plan::consumed`), and computes only its own ranks' results
//! (`Plan::receive`: the same reduction order and casts as one process). An error in one
//! process is sent to all of them (no process waits for a peer that gave up).

use super::fabric::FabricParams;
use super::sched::Scheduler;
use super::ultra::{
    chip_err, close_run, finish, place, rank_err, ranks_of, start, take_outboxes, Arrival,
    Coordinator, Placed, UltraResult,
};
use super::{Device, RunOptions};
use crate::engines::intercore::part::{plan, Meta, Plan};
use crate::engines::intercore::{block_io, Shared, Snapshot};
use crate::error::{fail, EmuError, ErrorKind::*, Result};
use crate::isa::{Opcode, Program};
use std::collections::BTreeMap;
use std::ops::Range;

/// Messages to or from every process, in process order: one buffer and each one's size.
#[derive(Debug, Default)]
pub struct Msgs {
    pub data: Vec<u8>,
    pub counts: Vec<usize>,
}

impl Msgs {
    /// Where process `q`'s message starts in `data`.
    fn offset(&self, q: usize) -> usize {
        self.counts.iter().take(q).sum()
    }
    fn part(&self, q: usize) -> &[u8] {
        let at = self.offset(q);
        self.data.get(at..at + self.counts[q]).unwrap_or(&[])
    }
}

/// An all-to-all of bytes: this process's message for every process in, every process's
/// message for this one out.
pub type Exchange<'a> = dyn FnMut(Msgs) -> Result<Msgs> + 'a;

/// The processes of a run: this one (`me`), how many, and the process of every chip.
pub struct Procs<'a> {
    pub me: usize,
    pub count: usize,
    pub owner: &'a [usize],
}

impl Procs<'_> {
    fn owns(&self, chip: usize) -> bool {
        self.owner.get(chip) == Some(&self.me)
    }
    /// The same message to every process; every process's message back.
    fn all(&self, ex: &mut Exchange, msg: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let got = ex(Msgs {
            data: msg.repeat(self.count),
            counts: vec![msg.len(); self.count],
        })?;
        if got.counts.len() != self.count || got.counts.iter().sum::<usize>() != got.data.len() {
            return Err(truncated());
        }
        Ok((0..self.count).map(|q| got.part(q).to_vec()).collect())
    }
}

/// Run programs placed on the chips `devs` with this process owning the chips `procs` gives
/// it; every process calls it with the same devices' programs. Returns the result with the
/// owned chips' `RunResult`s (others empty) and the whole fabric trace.
pub fn run(
    devs: &mut [&mut Device],
    programs: &[Placed],
    opts: &RunOptions,
    params: FabricParams,
    procs: &Procs,
    exchange: &mut Exchange,
) -> Result<UltraResult> {
    let by_chip = place(devs.len(), programs)?;
    let r = run_owned(devs, &by_chip, opts, params, procs, exchange);
    close_run(devs, &by_chip, r)
}

/// Each open arrival's metadata, by (chip, core, stream agent): a stream waits in one
/// collective at a time.
type Metas = BTreeMap<(usize, u8, usize), Meta>;

fn run_owned(
    devs: &mut [&mut Device],
    by_chip: &[Vec<&Program>],
    opts: &RunOptions,
    params: FabricParams,
    procs: &Procs,
    exchange: &mut Exchange,
) -> Result<UltraResult> {
    let nchips = devs.len();
    let started = start(devs, by_chip, opts, params, &|c| procs.owns(c));
    let (mut co, mut scheds) = match started {
        Ok(x) => x,
        Err(e) => {
            let _ = procs.all(exchange, status(Some(&e)));
            return Err(e);
        }
    };
    let look = params.lookahead_ps();
    let mut next: Vec<Option<u64>> = vec![None; nchips];
    let mut woken: Vec<usize> = (0..nchips).collect();
    let mut metas = Metas::new();
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
        let all = checked(procs.all(exchange, msg)?, r)?;
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
        let all = checked(procs.all(exchange, msg)?, r)?;
        let mut incoming = Vec::new();
        for (p, b) in all.iter().enumerate() {
            if p != procs.me {
                decode_all(&b[1..], &mut incoming, &mut metas)?;
            }
        }
        for (c, a) in out {
            metas.insert((c, a.core, a.agent), Meta::of(&a.snap));
            incoming.push((c, a));
        }
        // Chip order, as in one process (each chip's arrivals keep their order).
        incoming.sort_by_key(|(c, _)| *c);
        let groups = co.matched(incoming, by_chip);
        let mut d = Dist {
            co: &mut co,
            scheds: &mut scheds,
            by_chip,
            procs,
        };
        woken = d.complete(groups, &mut metas, exchange)?;
    }
    co.check_done(&scheds)?;
    Ok(finish(scheds, co))
}

/// A completed group: opcode, replica group, arrivals in rank order.
type Group = (Opcode, Vec<u16>, Vec<(usize, Arrival)>);

/// Where the bytes a process received for one group are: (sender rank, byte range of its src)
/// to their offset in the received buffer.
type Received = BTreeMap<(usize, usize, usize), usize>;

/// The completion of a window's groups in one process.
struct Dist<'a, 'd, 'p, 's> {
    co: &'a mut Coordinator,
    scheds: &'a mut [Option<Scheduler<'d, 'p>>],
    by_chip: &'a [Vec<&'p Program>],
    procs: &'a Procs<'s>,
}

impl<'p> Dist<'_, '_, 'p, '_> {
    /// Check every group (the same everywhere), exchange the bytes each process's ranks need,
    /// then perform and release each group in order; returns the owned chips with a release.
    fn complete(
        &mut self,
        groups: Vec<Group>,
        metas: &mut Metas,
        exchange: &mut Exchange,
    ) -> Result<Vec<usize>> {
        let mut planned = Vec::with_capacity(groups.len());
        for (_, _, arr) in &groups {
            let ranks = ranks_of(arr, self.by_chip)?;
            let m: Vec<Meta> = arr
                .iter()
                .map(|(c, a)| metas.remove(&(*c, a.core, a.agent)).unwrap_or_default())
                .collect();
            planned.push(plan(&ranks, &m).map_err(|e| rank_err(arr, &ranks, e))?);
        }
        let mut received: Vec<Received> = groups.iter().map(|_| Received::new()).collect();
        let mut got = Msgs::default();
        if planned.iter().any(|p| p.has_data() && !p.is_in_place()) {
            got = exchange(self.sends(&groups, &planned))?;
            if got.counts.len() != self.procs.count {
                return Err(truncated());
            }
            for q in (0..self.procs.count).filter(|&q| q != self.procs.me) {
                let at = got.offset(q);
                self.index(q, at, at + got.counts[q], &groups, &planned, &mut received)?;
            }
            if got.counts.iter().sum::<usize>() > got.data.len() {
                return Err(truncated());
            }
        }
        let mut woken = Vec::new();
        let items = groups.into_iter().zip(planned.into_iter().zip(received));
        for ((op, cores, arr), (p, rec)) in items {
            let outs = if p.is_in_place() {
                self.in_place(&arr, &p, exchange)?;
                (0..arr.len()).map(|_| None).collect()
            } else {
                self.perform(&arr, &p, &rec, &got.data)
            };
            let chips = self
                .co
                .release((op, &cores), &arr, &p.moved, outs, self.scheds);
            woken.extend(chips.into_iter().filter(|c| self.scheds[*c].is_some()));
        }
        woken.sort_unstable();
        woken.dedup();
        Ok(woken)
    }

    /// The ranks of a group in process `q` (rank indices).
    fn ranks_in(&self, arr: &[(usize, Arrival)], q: usize) -> Vec<usize> {
        (0..arr.len())
            .filter(|&r| self.procs.owner.get(arr[r].0) == Some(&q))
            .collect()
    }

    /// What this process sends each other process q: for every group, the bytes q's ranks
    /// consume of this process's senders (each distinct range once), in group and rank order.
    fn sends(&mut self, groups: &[Group], planned: &[Plan]) -> Msgs {
        let me = self.procs.me;
        let mut items: Vec<(usize, usize, Range<usize>)> = Vec::new();
        let mut counts = vec![0usize; self.procs.count];
        for (q, n) in counts.iter_mut().enumerate().filter(|(q, _)| *q != me) {
            for (g, ((_, _, arr), p)) in groups.iter().zip(planned).enumerate() {
                if p.is_in_place() {
                    continue;
                }
                let theirs = self.ranks_in(arr, q);
                for i in self.ranks_in(arr, me) {
                    for range in wanted(p, i, &theirs) {
                        *n += range.len();
                        items.push((g, i, range));
                    }
                }
            }
        }
        let mut data = Vec::with_capacity(counts.iter().sum());
        for (g, i, range) in items {
            let src = &groups[g].2[i].1.snap.src;
            data.extend_from_slice(src.get(range).unwrap_or(&[]));
        }
        Msgs { data, counts }
    }

    /// Index peer `q`'s message (bytes `at..end` of the received buffer) by the pieces it sent
    /// for each group, in the order `sends` wrote them.
    fn index(
        &self,
        q: usize,
        mut at: usize,
        end: usize,
        groups: &[Group],
        planned: &[Plan],
        received: &mut [Received],
    ) -> Result<()> {
        for (g, ((_, _, arr), p)) in groups.iter().zip(planned).enumerate() {
            if p.is_in_place() {
                continue;
            }
            let mine = self.ranks_in(arr, self.procs.me);
            for i in self.ranks_in(arr, q) {
                for range in wanted(p, i, &mine) {
                    received[g].insert((i, range.start, range.end), at);
                    at += range.len();
                }
            }
        }
        if at != end {
            return Err(truncated());
        }
        Ok(())
    }

    /// Perform a group (not an in-place all_to_all) for this process's ranks: their new dst
    /// bytes, released later. `rec` indexes the pieces received in `data`.
    fn perform(
        &mut self,
        arr: &[(usize, Arrival)],
        p: &Plan,
        rec: &Received,
        data: &[u8],
    ) -> Vec<Option<Shared>> {
        let n = arr.len();
        let mut outs: Vec<Option<Shared>> = (0..n).map(|_| None).collect();
        if !p.has_data() {
            return outs;
        }
        let piece = |i: usize, r: usize| -> &[u8] {
            let range = p.consumed(i, r);
            if let Some(&at) = rec.get(&(i, range.start, range.end)) {
                return data.get(at..at + range.len()).unwrap_or(&[]);
            }
            arr[i].1.snap.src.get(range).unwrap_or(&[])
        };
        let rounder = self.co.rounder(arr);
        for r in self.ranks_in(arr, self.procs.me) {
            let pieces: Vec<&[u8]> = (0..n).map(|i| piece(i, r)).collect();
            outs[r] = p.receive(r, &pieces, &arr[r].1.snap, &rounder);
        }
        outs
    }

    /// An in-place all_to_all (block r of rank i's buffer and block i of rank r's swap): the
    /// pairs of this process's ranks locally, block by block; the pairs with another process's
    /// ranks in rounds of at most `ROUND_BYTES` per peer, each round sending the blocks it
    /// then overwrites with what it receives (both sides list the pairs in the same order), so
    /// no round needs more than its own blocks in memory.
    fn in_place(
        &mut self,
        arr: &[(usize, Arrival)],
        p: &Plan,
        exchange: &mut Exchange,
    ) -> Result<()> {
        let (me, count) = (self.procs.me, self.procs.count);
        let mine = self.ranks_in(arr, me);
        for (x, &i) in mine.iter().enumerate() {
            for &r in &mine[x + 1..] {
                let a = self.block(arr, p, i, r, None);
                let b = self.block(arr, p, r, i, None);
                self.block(arr, p, i, r, Some(&b));
                self.block(arr, p, r, i, Some(&a));
            }
        }
        let Some((ap, blk)) = p.in_place(0) else {
            return Ok(());
        };
        let bytes = blk * ap.dtype.size();
        let per = (ROUND_BYTES / bytes.max(1)).max(1);
        let sizes: Vec<usize> = (0..count).map(|q| self.ranks_in(arr, q).len()).collect();
        let mut pairs: Vec<Vec<(usize, usize)>> = vec![Vec::new(); count];
        for (q, list) in pairs.iter_mut().enumerate().filter(|(q, _)| *q != me) {
            let theirs = self.ranks_in(arr, q);
            *list = mine
                .iter()
                .flat_map(|&i| theirs.iter().map(move |&r| (i, r)))
                .collect();
            list.sort_by_key(|&(i, r)| (i.min(r), i.max(r)));
        }
        // The same number of rounds in every process: the most pairs between two processes.
        let most = (0..count)
            .flat_map(|a| (0..count).filter(move |&b| b != a).map(move |b| (a, b)))
            .map(|(a, b)| sizes[a] * sizes[b])
            .max()
            .unwrap_or(0);
        for k in 0..most.div_ceil(per) {
            let round = |q: usize| pairs[q].iter().skip(k * per).take(per).copied();
            let mut msgs = Msgs {
                data: Vec::new(),
                counts: vec![0; count],
            };
            for q in 0..count {
                for (i, r) in round(q) {
                    msgs.data.extend(self.block(arr, p, i, r, None));
                    msgs.counts[q] += bytes;
                }
            }
            let got = exchange(msgs)?;
            if got.counts
                != (0..count)
                    .map(|q| round(q).count() * bytes)
                    .collect::<Vec<_>>()
            {
                return Err(truncated());
            }
            for q in 0..count {
                let mut at = got.offset(q);
                for (i, r) in round(q) {
                    let b = got.data.get(at..at + bytes).ok_or_else(truncated)?;
                    self.block(arr, p, i, r, Some(b));
                    at += bytes;
                }
            }
        }
        Ok(())
    }

    /// Read (`None`) or write block `r` of rank `i`'s in-place all_to_all buffer.
    fn block(
        &mut self,
        arr: &[(usize, Arrival)],
        p: &Plan,
        i: usize,
        r: usize,
        data: Option<&[u8]>,
    ) -> Vec<u8> {
        let (Some((ap, blk)), (c, a)) = (p.in_place(i), &arr[i]) else {
            return Vec::new();
        };
        match &mut self.scheds[*c] {
            Some(s) => s.with_mems(a.core, |m| block_io(m, ap, r * blk, blk, data)),
            None => Vec::new(),
        }
    }
}

/// Bytes an in-place all_to_all sends each peer per round (its buffers' size).
const ROUND_BYTES: usize = 4 << 20;

/// The distinct byte ranges of sender `i` that the receivers `rs` consume, in their order.
fn wanted(plan: &Plan, i: usize, rs: &[usize]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for &r in rs {
        let range = plan.consumed(i, r);
        if !range.is_empty() && !out.contains(&range) {
            out.push(range);
        }
    }
    out
}

fn truncated() -> EmuError {
    fail(
        Internal,
        "ultra_dist_message_truncated",
        "a distributed UltraServer message ended early",
    )
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

/// One arrival as bytes: chip, core, agent, idx, time, vc, group, its data's `Meta`.
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
    out.extend((a.snap.src.len() as u64).to_le_bytes());
    let counts: Vec<u8> = a.snap.counts.iter().flat_map(|x| x.to_le_bytes()).collect();
    put_bytes(out, &counts);
    out.extend((a.snap.dst.len() as u64).to_le_bytes());
    out.push(a.snap.deferred as u8);
}

struct Reader<'b>(&'b [u8]);

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8]> {
        if self.0.len() < n {
            return Err(truncated());
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

fn decode_all(mut b: &[u8], out: &mut Vec<(usize, Arrival)>, metas: &mut Metas) -> Result<()> {
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
        let src_len = r.u64()? as usize;
        let counts = r.bytes()?.chunks_exact(8);
        let counts = counts.map(|x| u64_at(x, 0) as i64).collect();
        let dst_len = r.u64()? as usize;
        let deferred = r.take(1)?[0] != 0;
        let meta = Meta {
            src_len,
            counts,
            dst_len,
            deferred,
        };
        let snap = Snapshot {
            deferred,
            ..Snapshot::default()
        };
        metas.insert((chip, core, agent), meta);
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
