//! The checks of the blocking collectives that a World all on one node
//! runs in its shared-memory slots (fabric-msg's
//! `world/collectives/on_node.rs`), where they differ from the message
//! schedules: lengths at and just past a slot (past it the headers go
//! through the slots and the data as messages), more collectives in a row
//! than a rank has slots, a non-blocking collective in flight across them,
//! and the same bits on every rank from a float sum whose value depends on
//! the order. Elsewhere (TCP, communicators) the same checks run as
//! messages.

use super::{fold, Ctx};
use fabric_msg::Op;

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
        // Every rank gets the same bits, though the sum depends on the order:
        // in a slot, and larger than one (on one node each rank folds its
        // part of the data from the others' memory, `on_node_copy.rs`).
        for len in [7, 3 * SLOT as u32 / 8 + 5] {
            self.same_bits(len)?;
        }
        Ok(())
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
