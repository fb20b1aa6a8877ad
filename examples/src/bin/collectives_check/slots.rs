//! The checks of the blocking collectives that a World all on one node
//! runs in its shared-memory slots (fabric-msg's
//! `world/collectives/on_node.rs`), where they differ from the message
//! schedules: lengths at and just past a slot (past it the headers go
//! through the slots and the data as messages), more collectives in a row
//! than a rank has slots, a non-blocking collective in flight across them,
//! non-blocking calls of every kind in flight at once (in the slots too,
//! where their data fits), and the same bits on every rank from a float sum whose value depends on
//! the order. Elsewhere (TCP, communicators) the same checks run as
//! messages.

use super::{fold, Ctx};
use fabric_msg::{Comm, Op, Persistent};

/// `$s.world.$m(args)` on the World (`$comm` `None`) or on the
/// communicator `$comm`: the same calls, the same types.
macro_rules! on {
    ($s:expr, $comm:expr, $m:ident($($a:expr),*)) => {
        match $comm {
            Some(c) => $s.world.on(c).$m($($a),*),
            None => $s.world.$m($($a),*),
        }
    };
}

/// The bytes of data a slot holds (fabric-msg's `SLOT_DATA`).
const SLOT: usize = 8 << 10;

impl Ctx<'_> {
    pub(super) fn slots(&mut self) -> fabric_msg::Result<()> {
        let (rank, size) = (self.world.rank(), self.world.size());
        let me = rank as usize;
        for n in [SLOT / 8, SLOT / 8 + 1, 3 * SLOT / 8] {
            let (case, mut rng) = self.next_case();
            let root = rng.below(u64::from(size)) as u32;
            let inputs: Vec<Vec<u64>> = self.all_inputs(case, &vec![n; size as usize]);
            let mut data = inputs[me].clone();
            self.world.allreduce(&mut data, Op::Sum)?;
            let sum = fold(&inputs, |a, b| a.wrapping_add(b));
            self.tally.expect(&format!("allreduce u64 n={n}"), &data, &sum);
            let mut data = inputs[me].clone();
            self.world.reduce(root, &mut data, Op::Max)?;
            let want = if rank == root {
                fold(&inputs, |a, b| a.max(b))
            } else {
                inputs[me].clone()
            };
            self.tally
                .expect(&format!("reduce u64 n={n} root={root}"), &data, &want);
            let mut data = if rank == root {
                inputs[me].clone()
            } else {
                vec![0; n]
            };
            self.world.broadcast(root, &mut data)?;
            self.tally.expect(
                &format!("broadcast u64 n={n} root={root}"),
                &data,
                &inputs[root as usize],
            );
        }
        // Many more in a row than a rank has slots, with a non-blocking
        // allreduce in flight across them.
        let (case, _) = self.next_case();
        let inputs: Vec<Vec<u32>> = self.all_inputs(case, &vec![5; size as usize]);
        let pending = self.world.iallreduce(inputs[me].clone(), Op::Sum)?;
        let mut total = [0u64];
        for i in 0..64u64 {
            let mut x = [u64::from(rank) + i];
            self.world.allreduce(&mut x, Op::Sum)?;
            total[0] += x[0];
            if i % 8 == 0 {
                self.world.barrier()?;
            }
        }
        let n = u64::from(size);
        let want: u64 = (0..64).map(|i| n * (n - 1) / 2 + n * i).sum();
        self.tally.expect("64 allreduces in a row", &total, &[want]);
        let got = self.world.wait(pending)?;
        let want = fold(&inputs, |a, b| a.wrapping_add(b));
        self.tally.expect("an iallreduce across them", &got, &want);
        (self.nb_in_slots, self.nb_copied) = self.non_blocking_in_flight(None)?;
        // Every rank gets the same bits, though the sum depends on the order:
        // in a slot, and larger than one (on one node each rank folds its
        // part of the data from the others' memory, `on_node_copy.rs`).
        for len in [7, 3 * SLOT as u32 / 8 + 5] {
            self.same_bits(len)?;
        }
        Ok(())
    }

    /// Non-blocking calls of every kind in flight at once, more of them
    /// than a rank has slots, an allreduce, a broadcast and a reduce larger
    /// than a slot among them (by one copy between calls in the slots, or
    /// message schedules), waited for last first, then a blocking call
    /// behind ones never waited for (one of them larger than a slot): on
    /// the World, or on `comm` (in its own slots where it has them,
    /// `comm.rs`). How many of its calls ran in slots, and how many of
    /// them by one copy.
    pub(super) fn non_blocking_in_flight(&mut self, comm: Option<&Comm>) -> fabric_msg::Result<(u64, u64)> {
        let before = self.world.stats().node_collectives;
        let copied_before = self.world.stats().node_single_copy_collectives;
        let (rank, size) = match comm {
            Some(c) => (c.rank(), c.size()),
            None => (self.world.rank(), self.world.size()),
        };
        let label = if comm.is_some() { "on a communicator: " } else { "" };
        let me = rank as usize;
        let mut started = Vec::new();
        let mut barriers = Vec::new();
        for i in 0..12u32 {
            let (case, mut rng) = self.next_case();
            let n = if (5..8).contains(&i) {
                SLOT / 8 + 3
            } else {
                1 + rng.below(40) as usize
            };
            let root = rng.below(u64::from(size)) as u32;
            let inputs: Vec<Vec<u64>> = self.all_inputs(case, &vec![n; size as usize]);
            let mine = inputs[me].clone();
            let (what, req, want) = match i % 4 {
                0 | 1 => (
                    format!("{label}iallreduce #{i} n={n}"),
                    on!(self, comm, iallreduce(mine, Op::Sum))?,
                    fold(&inputs, |a, b| a.wrapping_add(b)),
                ),
                2 => (
                    format!("{label}ibroadcast #{i} n={n} root={root}"),
                    on!(self, comm, ibroadcast(root, mine))?,
                    inputs[root as usize].clone(),
                ),
                _ => (
                    format!("{label}ireduce #{i} n={n} root={root}"),
                    on!(self, comm, ireduce(root, mine, Op::Max))?,
                    if rank == root {
                        fold(&inputs, |a, b| a.max(b))
                    } else {
                        Vec::new()
                    },
                ),
            };
            started.push((what, req, want));
            if i % 5 == 0 {
                barriers.push(on!(self, comm, ibarrier())?);
            }
        }
        while let Some((what, req, want)) = started.pop() {
            let got = self.world.wait(req)?;
            self.tally.expect(&what, &got, &want);
        }
        for b in barriers {
            self.world.wait(b)?;
        }
        // A persistent allreduce started more times than a rank has slots
        // before any is waited for (in the slots too, on one node).
        let plan: Persistent<u64> = on!(self, comm, allreduce_init(4, Op::Sum))?;
        let mut starts = Vec::new();
        for j in 0..6u64 {
            starts.push(self.world.start(&plan, vec![u64::from(rank) + j; 4])?);
        }
        let n = u64::from(size);
        for (j, r) in (0u64..).zip(starts) {
            let got = self.world.wait(r)?;
            let want = [n * (n - 1) / 2 + n * j; 4];
            self.tally
                .expect(&format!("{label}persistent allreduce start {j}"), &got, &want);
        }
        // A start of the wrong length fails on this rank, and the World goes
        // on: every rank refused it in its slot, so the next call meets.
        match self.world.start(&plan, vec![0u64; 5]) {
            Err(fabric_msg::Error::Usage(m)) if m.contains("planned for") => {}
            other => self.tally.failures.push(format!(
                "{label}a persistent start of the wrong length: {other:?}"
            )),
        }
        // Started and never waited for, then a blocking call: it comes after
        // them, so it finishes them first.
        let (case, _) = self.next_case();
        let inputs: Vec<Vec<u64>> = self.all_inputs(case, &vec![3; size as usize]);
        // Larger than a slot, so that its memory is lent to the others'
        // reads where it goes by one copy when its request is dropped.
        let big: Vec<u64> = vec![u64::from(rank); SLOT / 8 + 1];
        let dropped = on!(self, comm, iallreduce(big, Op::Sum))?;
        let kept = on!(self, comm, iallreduce(inputs[me].clone(), Op::Max))?;
        drop(dropped);
        let mut x = [u64::from(rank)];
        on!(self, comm, allreduce(&mut x, Op::Sum))?;
        self.tally.expect(
            &format!("{label}an allreduce behind non-blocking ones"),
            &x,
            &[n * (n - 1) / 2],
        );
        let got = self.world.wait(kept)?;
        self.tally.expect(
            &format!("{label}an iallreduce started before it"),
            &got,
            &fold(&inputs, |a, b| a.max(b)),
        );
        // A persistent allreduce larger than a slot, started twice in flight.
        let len = SLOT / 8 + 5;
        let plan: Persistent<u64> = on!(self, comm, allreduce_init(len, Op::Sum))?;
        let first = self.world.start(&plan, vec![u64::from(rank); len])?;
        let second = self.world.start(&plan, vec![u64::from(rank) * 3; len])?;
        let (got_second, got_first) = (self.world.wait(second)?, self.world.wait(first)?);
        let sum = n * (n - 1) / 2;
        self.tally.expect(
            &format!("{label}persistent allreduce larger than a slot, start 0"),
            &got_first,
            &vec![sum; len],
        );
        self.tally.expect(
            &format!("{label}persistent allreduce larger than a slot, start 1"),
            &got_second,
            &vec![3 * sum; len],
        );
        let stats = self.world.stats();
        Ok((
            stats.node_collectives - before,
            stats.node_single_copy_collectives - copied_before,
        ))
    }

    /// An f64 sum of `len` elements whose value depends on the order gives
    /// every rank the same bits.
    fn same_bits(&mut self, len: u32) -> fabric_msg::Result<()> {
        let (rank, size) = (self.world.rank(), self.world.size());
        let mut x: Vec<f64> = (0..len)
            .map(|i| {
                let sign = if (rank + i) % 2 == 0 { 1.0 } else { -1.0 };
                sign * 10f64.powi((rank % 7) as i32 * 3) / f64::from(3 + rank + i)
            })
            .collect();
        self.world.allreduce(&mut x, Op::Sum)?;
        let bits: Vec<u64> = x.iter().map(|v| v.to_bits()).collect();
        let all = self.world.allgather(&bits)?;
        self.tally.expect(
            &format!("an f64 sum of {len}, the same bits on every rank"),
            &all,
            &bits.repeat(size as usize),
        );
        Ok(())
    }
}
