//! Data-parallel training's gradient allreduce, written as an MPI
//! programmer (or PyTorch's DistributedDataParallel) does it, beside its
//! C + MPI twin (`examples/mpi/sgd.c`): every rank holds the whole model
//! and a shard of the data, computes its gradient bucket by bucket in the
//! backward pass's order (last bucket first), starts a non-blocking sum of
//! each bucket as soon as it is ready, waits for them all, and takes the
//! averaged step. Every 10 steps it sums the loss over the World.
//!
//! The model is a separable least-squares fit, so it runs at memory speed
//! and the allreduce is most of each step: rank `r`'s loss is
//! `Σᵢ ½ aᵣᵢ (wᵢ − bᵣᵢ)²` with `a` and `b` drawn from a hash of `(r, i)`,
//! and the fit converges to `wᵢ* = Σᵣ aᵣᵢ bᵣᵢ / Σᵣ aᵣᵢ`. At the end rank 0
//! prints the loss, the largest distance from `w*`, whether every rank
//! holds the same model (the same bits), and the training loop's time.
//!
//! ```text
//! mpirun -np 4 sgd [parameters] [steps] [buckets]
//! ```

use fabric_msg::{Op, World};
use std::time::Instant;

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Rank `r`'s curvature `a` (in [0.5, 1.5)) and target `b` (in [-1, 1])
/// for parameter `i`.
fn coeffs(r: u64, i: u64) -> (f32, f32) {
    let h = mix((r << 32) | i);
    let a = 0.5 + (h % 1000) as f32 / 1000.0;
    let b = ((h >> 20) % 2001) as f32 / 1000.0 - 1.0;
    (a, b)
}

fn main() -> Result<(), fabric_msg::Error> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let p = args.next().and_then(Result::ok).unwrap_or(1 << 20).max(1);
    let steps = args.next().and_then(Result::ok).unwrap_or(50);
    let buckets = args.next().and_then(Result::ok).unwrap_or(4).clamp(1, p);
    let lr = 0.5f32;

    let mut world = World::init()?;
    let (rank, size) = (world.rank(), world.size());
    let (a, b): (Vec<f32>, Vec<f32>) = (0..p as u64).map(|i| coeffs(u64::from(rank), i)).unzip();
    let mut w = vec![0.0f32; p];
    let chunk = p.div_ceil(buckets);
    let bucket = |k: usize| k * chunk..((k + 1) * chunk).min(p);
    // Each bucket's gradient buffer goes to its allreduce and comes back
    // as the sum, so the same memory serves every step.
    let mut grads: Vec<Vec<f32>> = (0..buckets).map(|k| vec![0.0; bucket(k).len()]).collect();

    world.barrier()?;
    let started = Instant::now();
    let mut loss = f64::NAN;
    for step in 1..=steps {
        // Backward pass: the last bucket's gradient is ready first, and
        // each bucket's sum starts as soon as its gradient is there.
        let mut sums = Vec::with_capacity(buckets);
        for k in (0..buckets).rev() {
            let mut g = std::mem::take(&mut grads[k]);
            for (g, i) in g.iter_mut().zip(bucket(k)) {
                *g = a[i] * (w[i] - b[i]);
            }
            sums.push(world.iallreduce(g, Op::Sum)?);
        }
        for (k, g) in (0..buckets).rev().zip(world.wait_all(sums)?) {
            for (x, s) in w[bucket(k)].iter_mut().zip(&g) {
                *x -= lr * s / size as f32;
            }
            grads[k] = g;
        }
        if step % 10 == 0 || step == steps {
            let mine = (0..p).map(|i| 0.5 * f64::from(a[i]) * f64::from(w[i] - b[i]).powi(2));
            let mut l = [mine.sum::<f64>()];
            world.allreduce(&mut l, Op::Sum)?;
            loss = l[0];
        }
    }
    let secs = started.elapsed().as_secs_f64();

    // Every rank must hold the same model: the smallest and largest
    // checksum over the World are this rank's.
    let check: f64 = w.iter().map(|&x| f64::from(x)).sum();
    let (mut lo, mut hi) = ([check], [check]);
    world.allreduce(&mut lo, Op::Min)?;
    world.allreduce(&mut hi, Op::Max)?;
    let same = lo[0].to_bits() == hi[0].to_bits();
    if rank == 0 {
        let mut error = 0.0f64;
        for (i, &x) in w.iter().enumerate() {
            let (mut ab, mut sa) = (0.0f64, 0.0f64);
            for r in 0..u64::from(size) {
                let (a, b) = coeffs(r, i as u64);
                ab += f64::from(a) * f64::from(b);
                sa += f64::from(a);
            }
            error = error.max((f64::from(x) - ab / sa).abs());
        }
        println!(
            "sgd: {size} ranks, {p} parameters in {buckets} buckets, {steps} steps: loss {loss:.6e} error {error:.1e} \
             same {} time {:.3} ms/step",
            if same { "yes" } else { "no" },
            secs * 1e3 / steps.max(1) as f64
        );
    }
    world.finish()
}
