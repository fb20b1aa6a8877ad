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

fn two_level(world: &World) -> u64 {
    world.stats().two_level_collectives
}
