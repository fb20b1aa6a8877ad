//! The blocking allreduce, reduce, broadcast and barrier on a communicator
//! that spans nodes, in the manner of the World's checks: every rank draws
//! every member's input and checks its own result. The communicator: the
//! whole World in reverse rank order, so that a communicator's ranks, its
//! roots and its node leaders are not the World's. Where the World runs in
//! two levels, so does it (`world/two_level.rs`). (A communicator of some
//! ranks only would leave the ranks with different counts of checks and
//! of slot calls, which the tests compare; its misuse runs with
//! `--on-comm`.)

use super::{fold, input, Ctx, Value};
use fabric_msg::{Comm, Op, World};

impl Ctx<'_> {
    /// The communicator's checks (collective on the World); how many of
    /// its collectives ran in two levels.
    pub(super) fn communicator(&mut self) -> fabric_msg::Result<u64> {
        let rank = self.world.rank();
        let before = two_level(self.world);
        let reversed = self
            .world
            .split(Some(0), -i64::from(rank))?
            .expect("every rank has the colour");
        self.on_comm(&reversed, "reversed")?;
        // Its non-blocking and persistent calls, as the World's are checked
        // (in its own slots on one node: `slots.rs`), then beside the
        // World's.
        let (in_slots, copied) = self.non_blocking_in_flight(Some(&reversed))?;
        if before == 0 {
            // All on one node, the communicator has slots of its own as the
            // World has, and its non-blocking calls go through them, those
            // larger than a slot by one copy as the World's.
            self.tally.expect(
                "a communicator's non-blocking calls in its slots, as many as the World's in its own",
                &[in_slots, copied],
                &[self.nb_in_slots, self.nb_copied],
            );
        } else {
            // In two levels, the node steps of both go through their
            // nodes' slots (as many as their roots and leaders make), but
            // for a rank alone on its node.
            let shared = self.world.node_ranks().len() > 1;
            self.tally.expect(
                "a communicator's non-blocking calls in two levels, in node slots",
                &[in_slots > 0],
                &[shared],
            );
        }
        self.two_queues(&reversed)?;
        // The same beside a dup of the World (its ranks in the World's
        // order), whose calls may be started in another order than the
        // World's as well.
        let dup = self.world.dup()?;
        self.two_queues(&dup)?;
        drop(dup);
        let after = two_level(self.world);
        drop(reversed);
        self.world.barrier()?;
        Ok(after - before)
    }

    fn on_comm(&mut self, comm: &Comm, label: &str) -> fabric_msg::Result<()> {
        let (me, size) = (comm.rank(), comm.size());
        // From one element to past a slot (8 KiB), where the node steps go
        // on as messages.
        for n in [1usize, 7, 1000, 3000] {
            for op in [Op::Sum, Op::Max] {
                self.comm_case::<i64>(comm, label, n, op)?;
                self.comm_case::<f64>(comm, label, n, op)?;
            }
            let (case, mut rng) = self.next_case();
            let root = rng.below(u64::from(size)) as u32;
            let want: Vec<u32> = input(self.seed, case, root, n);
            let mut data = if me == root { want.clone() } else { vec![0; n] };
            self.world.on(comm).broadcast(root, &mut data)?;
            self.tally
                .expect(&format!("{label}: broadcast u32 n={n} root={root}"), &data, &want);
            self.world.on(comm).barrier()?;
        }
        Ok(())
    }

    /// An allreduce and a reduce to a drawn root, of `n` elements with `op`.
    fn comm_case<T: Value>(&mut self, comm: &Comm, label: &str, n: usize, op: Op) -> fabric_msg::Result<()> {
        let (me, size) = (comm.rank(), comm.size());
        let name = std::any::type_name::<T>();
        let (case, mut rng) = self.next_case();
        let root = rng.below(u64::from(size)) as u32;
        let inputs: Vec<Vec<T>> = (0..size).map(|q| input(self.seed, case, q, n)).collect();
        let want = fold(&inputs, |a, b| T::apply(op, a, b));
        let mut data = inputs[me as usize].clone();
        self.world.on(comm).allreduce(&mut data, op)?;
        self.tally
            .expect(&format!("{label}: allreduce {name} {op:?} n={n}"), &data, &want);
        let mut data = inputs[me as usize].clone();
        self.world.on(comm).reduce(root, &mut data, op)?;
        let want = if me == root {
            want
        } else {
            inputs[me as usize].clone()
        };
        self.tally.expect(
            &format!("{label}: reduce {name} {op:?} n={n} root={root}"),
            &data,
            &want,
        );
        Ok(())
    }
}

impl Ctx<'_> {
    /// Non-blocking calls on `comm` and on the World started in one order
    /// on even ranks and the other on odd ones, and waited for in opposite
    /// orders, as MPI allows: on one node each has its own slots and queue,
    /// and a wait on one moves the other. Then a blocking World barrier
    /// while a call on `comm` is in flight on even ranks only, started
    /// after it on odd ones: the barrier waits only for the World's queue.
    pub(super) fn two_queues(&mut self, comm: &Comm) -> fabric_msg::Result<()> {
        let w = self.world.rank();
        let n = u64::from(self.world.size());
        let sum = n * (n - 1) / 2;
        let even = w % 2 == 0;
        let mine = |extra: u64| vec![u64::from(w) + extra; 3];
        let (c, x) = if even {
            let c = self.world.on(comm).iallreduce(mine(0), Op::Sum)?;
            (c, self.world.iallreduce(mine(1), Op::Sum)?)
        } else {
            let x = self.world.iallreduce(mine(1), Op::Sum)?;
            (self.world.on(comm).iallreduce(mine(0), Op::Sum)?, x)
        };
        let (gc, gx) = if even {
            let gx = self.world.wait(x)?;
            (self.world.wait(c)?, gx)
        } else {
            let gc = self.world.wait(c)?;
            (gc, self.world.wait(x)?)
        };
        self.tally
            .expect("a communicator's iallreduce beside the World's", &gc, &[sum; 3]);
        self.tally.expect(
            "the World's iallreduce beside a communicator's",
            &gx,
            &[sum + n; 3],
        );
        let c = if even {
            let c = self.world.on(comm).iallreduce(mine(2), Op::Sum)?;
            self.world.barrier()?;
            c
        } else {
            self.world.barrier()?;
            self.world.on(comm).iallreduce(mine(2), Op::Sum)?
        };
        let got = self.world.wait(c)?;
        self.tally.expect(
            "a communicator's iallreduce across a World barrier",
            &got,
            &[sum + 2 * n; 3],
        );
        Ok(())
    }
}

fn two_level(world: &World) -> u64 {
    world.stats().two_level_collectives
}
