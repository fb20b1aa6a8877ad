//! The checks of scatter(v), alltoall(v), scan, exscan,
//! reduce_scatter_block and the non-blocking gather and allgather of equal
//! lengths, in the manner of the others: every rank draws every rank's
//! input from the seed and checks its own result against a sequential
//! reference. Also the two misuses the failure tests start.

use super::{fold, Ctx, Value};
use fabric_msg::{Op, Reduction, World};

/// `x ⊕ y = x`: associative, not commutative; a prefix combined out of
/// rank order comes out as another rank's value.
fn first<T: Value>(_acc: &mut [T], _other: &[T]) {}

impl Ctx<'_> {
    /// The newer collectives at every length of `self.sizes`, then their v
    /// forms with uneven counts.
    pub(super) fn more<T: Value>(&mut self, ops: &[Op]) -> fabric_msg::Result<()> {
        let (rank, size) = (self.world.rank(), self.world.size());
        let (me, p) = (rank as usize, size as usize);
        let name = std::any::type_name::<T>();
        for n in self.sizes.clone() {
            // scatter: block r of the root's data is rank r's input.
            let (case, mut rng) = self.next_case();
            let root = rng.below(u64::from(size)) as u32;
            let blocks: Vec<Vec<T>> = self.all_inputs(case, &vec![n; p]);
            let data = if rank == root { blocks.concat() } else { vec![] };
            let got = self.world.scatter(root, &data, n)?;
            self.tally
                .expect(&format!("scatter {name} n={n} root={root}"), &got, &blocks[me]);
            // alltoall: rank q's data holds its block for each rank.
            let (case, _) = self.next_case();
            let all: Vec<Vec<T>> = self.all_inputs(case, &vec![n * p; p]);
            let got = self.world.alltoall(&all[me])?;
            let want: Vec<T> = all
                .iter()
                .flat_map(|v| v[me * n..(me + 1) * n].to_vec())
                .collect();
            self.tally.expect(&format!("alltoall {name} n={n}"), &got, &want);
            // scan and exscan, with a random op and a non-commutative one.
            let (case, mut rng) = self.next_case();
            let op = ops[rng.below(ops.len() as u64) as usize];
            let inputs: Vec<Vec<T>> = self.all_inputs(case, &vec![n; p]);
            let apply = |a, b| T::apply(op, a, b);
            let mut data = inputs[me].clone();
            self.world.scan(&mut data, op)?;
            self.tally.expect(
                &format!("scan {name} {op:?} n={n}"),
                &data,
                &fold(&inputs[..=me], apply),
            );
            let got = self.world.exscan(&inputs[me], op)?;
            let want = (me > 0).then(|| fold(&inputs[..me], apply));
            self.tally
                .expect(&format!("exscan {name} {op:?} n={n}"), &[got], &[want]);
            let mut data = inputs[me].clone();
            self.world.scan(&mut data, Reduction::custom(first::<T>))?;
            self.tally
                .expect(&format!("scan {name} first n={n}"), &data, &inputs[0]);
            let got = self.world.exscan(&inputs[me], Reduction::custom(first::<T>))?;
            let want = (me > 0).then(|| inputs[0].clone());
            self.tally
                .expect(&format!("exscan {name} first n={n}"), &[got], &[want]);
            // reduce_scatter_block
            let (case, mut rng) = self.next_case();
            let op = ops[rng.below(ops.len() as u64) as usize];
            let vectors: Vec<Vec<T>> = self.all_inputs(case, &vec![n * p; p]);
            let got = self.world.reduce_scatter_block(&vectors[me], op)?;
            let want = fold(&vectors, |a, b| T::apply(op, a, b))[me * n..(me + 1) * n].to_vec();
            self.tally
                .expect(&format!("reduce_scatter_block {name} {op:?} n={n}"), &got, &want);
            // igather and iallgather in flight together.
            let (case, mut rng) = self.next_case();
            let root = rng.below(u64::from(size)) as u32;
            let inputs: Vec<Vec<T>> = self.all_inputs(case, &vec![n; p]);
            let g = self.world.igather(root, inputs[me].clone())?;
            let a = self.world.iallgather(inputs[me].clone())?;
            let got_a = self.world.wait(a)?;
            let got_g = self.world.wait(g)?;
            let want_g = if rank == root { inputs.concat() } else { vec![] };
            self.tally
                .expect(&format!("igather {name} n={n} root={root}"), &got_g, &want_g);
            self.tally
                .expect(&format!("iallgather {name} n={n}"), &got_a, &inputs.concat());
        }
        for big in [false, true] {
            // scatterv
            let (case, mut rng) = self.next_case();
            let counts = Self::counts(&mut rng, size, big);
            let root = rng.below(u64::from(size)) as u32;
            let blocks: Vec<Vec<T>> = self.all_inputs(case, &counts);
            let data = if rank == root { blocks.concat() } else { vec![] };
            let got = self.world.scatterv(root, &data, &counts)?;
            self.tally.expect(
                &format!("scatterv {name} counts={counts:?} root={root}"),
                &got,
                &blocks[me],
            );
            // alltoallv: matrix[q] are rank q's send counts.
            let (case, mut rng) = self.next_case();
            let matrix: Vec<Vec<usize>> = (0..p).map(|_| Self::counts(&mut rng, size, big)).collect();
            let totals: Vec<usize> = matrix.iter().map(|row| row.iter().sum()).collect();
            let all: Vec<Vec<T>> = self.all_inputs(case, &totals);
            let recv: Vec<usize> = matrix.iter().map(|row| row[me]).collect();
            let got = self.world.alltoallv(&all[me], &matrix[me], &recv)?;
            let want: Vec<T> = (0..p)
                .flat_map(|q| {
                    let at: usize = matrix[q][..me].iter().sum();
                    all[q][at..at + matrix[q][me]].to_vec()
                })
                .collect();
            self.tally
                .expect(&format!("alltoallv {name} big={big}"), &got, &want);
        }
        Ok(())
    }
}

/// The root (rank 0) passes one count too few to a scatterv: it is
/// refused there, and every other rank, which waits for its block from the
/// root, is told. (A bad count on a rank no other rank depends on fails
/// that rank and the ranks that wait for it; the others may finish.)
pub(super) fn bad_scatterv(world: &mut World) -> fabric_msg::Result<Result<usize, Vec<String>>> {
    let (rank, size) = (world.rank(), world.size());
    let counts = vec![2; size as usize - usize::from(rank == 0)];
    let data = vec![1u32; 2 * size as usize];
    world.scatterv(0, &data, &counts).map(|_| Ok(0))
}

/// Rank 1 expects one element more from rank 0 than rank 0 sends it: rank
/// 1 sees the length and every other rank is told.
pub(super) fn alltoallv_mismatch(world: &mut World) -> fabric_msg::Result<Result<usize, Vec<String>>> {
    let (rank, size) = (world.rank(), world.size() as usize);
    let send = vec![3; size];
    let mut recv = vec![3; size];
    if rank == 1 {
        recv[0] = 4;
    }
    let data = vec![rank as i64; 3 * size];
    world.alltoallv(&data, &send, &recv).map(|_| Ok(0))
}

/// The last rank computes `secs` seconds before a barrier, an allreduce
/// and a broadcast that every other rank is already in: the others'
/// collectives wait for it (probing it after a second: which collective
/// they are in), and every result is right.
pub(super) fn late(world: &mut World, secs: u64) -> fabric_msg::Result<Result<usize, Vec<String>>> {
    let (rank, size) = (world.rank(), world.size());
    if rank == size - 1 {
        std::thread::sleep(std::time::Duration::from_secs(secs));
    }
    world.barrier()?;
    let mut v = vec![f64::from(rank) + 1.0; 1000];
    world.allreduce(&mut v, Op::Sum)?;
    let mut b = vec![if rank == 0 { 7u32 } else { 0 }; 16];
    world.broadcast(0, &mut b)?;
    let sum = f64::from(size) * f64::from(size + 1) / 2.0;
    let mut wrong = Vec::new();
    if v.iter().any(|&x| x != sum) {
        wrong.push(format!("allreduce: {} where {sum} was due", v[0]));
    }
    if b.iter().any(|&x| x != 7) {
        wrong.push(format!("broadcast: {b:?} where 7s were due"));
    }
    Ok(if wrong.is_empty() { Ok(3) } else { Err(wrong) })
}
