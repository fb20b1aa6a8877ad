//! A 1-D Jacobi heat stencil, written as an MPI programmer would write it,
//! beside its C + MPI twin (`examples/mpi/jacobi.c`): each rank owns
//! `n` cells plus one halo cell on each side, exchanges halos with its
//! neighbours every step (non-blocking, typed), and every `check` steps
//! reduces the residual over the World; at the end rank 0 gathers the
//! field and prints its sum. Both programs print the same line, bit for
//! bit, for the same arguments.
//!
//! ```text
//! mpirun -np 4 jacobi [cells per rank] [steps]
//! ```

use fabric_msg::{Op, World};

fn main() -> Result<(), fabric_msg::Error> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let n = args.next().and_then(Result::ok).unwrap_or(1000);
    let steps = args.next().and_then(Result::ok).unwrap_or(500);
    let check = 50;

    let mut world = World::init()?;
    let (rank, size) = (world.rank(), world.size());
    let left = (rank > 0).then(|| rank - 1);
    let right = (rank + 1 < size).then_some(rank + 1);

    // u[0] and u[n + 1] are the halos; the rod's ends are held at 0 and 1.
    let mut u = vec![0.0f64; n + 2];
    let mut next = u.clone();
    if right.is_none() {
        u[n + 1] = 1.0;
        next[n + 1] = 1.0;
    }
    let mut residual = f64::INFINITY;
    for step in 1..=steps {
        let mut reqs = Vec::with_capacity(4);
        if let Some(l) = left {
            reqs.push(world.irecv(Some(l), Some(0), vec![0.0; 1])?);
            world.isend(l, 1, &u[1..2]).map(drop)?;
        }
        if let Some(r) = right {
            reqs.push(world.irecv(Some(r), Some(1), vec![0.0; 1])?);
            world.isend(r, 0, &u[n..n + 1]).map(drop)?;
        }
        let halos = world.wait_all(reqs)?;
        let mut got = halos.iter();
        if left.is_some() {
            u[0] = got.next().map_or(0.0, |h| h[0]);
        }
        if right.is_some() {
            u[n + 1] = got.next().map_or(1.0, |h| h[0]);
        }
        let mut local = 0.0f64;
        for i in 1..=n {
            next[i] = 0.5 * (u[i - 1] + u[i + 1]);
            local += (next[i] - u[i]).abs();
        }
        std::mem::swap(&mut u, &mut next);
        if step % check == 0 {
            let mut r = [local];
            world.allreduce(&mut r, Op::Sum)?;
            residual = r[0];
        }
    }
    let all = world.gather(0, &u[1..=n])?;
    if rank == 0 {
        let sum: f64 = all.iter().sum();
        println!("jacobi: {size} ranks x {n} cells, {steps} steps: sum {sum:.12e} residual {residual:.6e}");
    }
    world.finish()
}
