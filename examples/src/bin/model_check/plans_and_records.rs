//! The persistent forms of every planned collective, and the
//! application's structs as elements: non-blocking reductions and scans
//! of `Record`s, and records as typed messages.

use super::{input, MinLoc};
use fabric_msg::{Comm, Op, Persistent, Record, Reduction, World};
use fabric_msg_examples::tally::Tally;

/// One start of `plan` with `data`, waited for.
fn once(world: &mut World, plan: &Persistent<i64>, data: Vec<i64>) -> fabric_msg::Result<Vec<i64>> {
    let req = world.start(plan, data)?;
    world.wait(req)
}

/// Each `…_init` of `comm`, started twice with different data, against
/// the same reference as its one-shot form.
pub fn persistent(world: &mut World, comm: &Comm, name: &str, t: &mut Tally) -> fabric_msg::Result<()> {
    let members = comm.members().to_vec();
    let (r, n) = (comm.rank() as usize, comm.size() as usize);
    let len = 3;
    let of = |w: u32, k: i64| -> Vec<i64> { (0..len).map(|i| input(w, i) * k).collect() };
    let mut view = world.on(comm);
    let reduce = view.reduce_init::<i64>(0, len, Op::Sum)?;
    let allgather = view.allgather_init::<i64>(len)?;
    let gather = view.gather_init::<i64>(n as u32 - 1, len)?;
    let scatter = view.scatter_init::<i64>(0, len)?;
    let alltoall = view.alltoall_init::<i64>(n)?;
    let scan = view.scan_init::<i64>(len, Op::Sum)?;
    let exscan = view.exscan_init::<i64>(len, Op::Max)?;
    let rsb = view.reduce_scatter_block_init::<i64>(n * len, Op::Sum)?;
    for k in [1i64, -2] {
        let all: Vec<Vec<i64>> = members.iter().map(|&w| of(w, k)).collect();
        let mine = all[r].clone();
        let fold = |ranks: &[Vec<i64>], f: fn(i64, i64) -> i64| -> Vec<i64> {
            (0..len)
                .map(|i| ranks.iter().map(|v| v[i]).reduce(f).unwrap_or(0))
                .collect()
        };
        let got = once(world, &reduce, mine.clone())?;
        let want = if r == 0 { fold(&all, |a, b| a + b) } else { vec![] };
        t.expect(&format!("{name}: persistent reduce ×{k}"), got, want);
        let got = once(world, &allgather, mine.clone())?;
        t.expect(&format!("{name}: persistent allgather ×{k}"), got, all.concat());
        let got = once(world, &gather, mine.clone())?;
        let want = if r == n - 1 { all.concat() } else { vec![] };
        t.expect(&format!("{name}: persistent gather ×{k}"), got, want);
        let data = if r == 0 { all.concat() } else { vec![] };
        let got = once(world, &scatter, data)?;
        t.expect(&format!("{name}: persistent scatter ×{k}"), got, mine.clone());
        let pairs: Vec<i64> = (0..n as i64)
            .map(|q| k * (i64::from(members[r]) * 100 + q))
            .collect();
        let got = once(world, &alltoall, pairs)?;
        let want: Vec<i64> = members
            .iter()
            .map(|&w| k * (i64::from(w) * 100 + r as i64))
            .collect();
        t.expect(&format!("{name}: persistent alltoall ×{k}"), got, want);
        let got = once(world, &scan, mine.clone())?;
        t.expect(
            &format!("{name}: persistent scan ×{k}"),
            got,
            fold(&all[..=r], |a, b| a + b),
        );
        let got = once(world, &exscan, mine.clone())?;
        let want = if r == 0 { vec![] } else { fold(&all[..r], i64::max) };
        t.expect(&format!("{name}: persistent exscan max ×{k}"), got, want);
        let wide = |w: u32| -> Vec<i64> { (0..n * len).map(|i| input(w, i) * k).collect() };
        let got = once(world, &rsb, wide(members[r]))?;
        let want: Vec<i64> = (r * len..(r + 1) * len)
            .map(|i| members.iter().map(|&w| wide(w)[i]).sum())
            .collect();
        t.expect(
            &format!("{name}: persistent reduce_scatter_block ×{k}"),
            got,
            want,
        );
    }
    Ok(())
}

/// MinLoc records reduced without blocking, scanned in rank order (by a
/// function that is associative but not commutative), and sent as typed
/// messages round `comm`.
pub fn records(world: &mut World, comm: &Comm, name: &str, t: &mut Tally) -> fabric_msg::Result<()> {
    let members = comm.members().to_vec();
    let (r, n) = (comm.rank() as usize, comm.size() as usize);
    let len = 4;
    let loc = |w: u32, i: usize| MinLoc {
        value: ((input(w, i) * 13) % 7) as f64,
        rank: w,
        slot: i as u32,
    };
    let of = |w: u32| -> Vec<MinLoc> { (0..len).map(|i| loc(w, i)).collect() };
    let least = || Reduction::records(|a: &mut MinLoc, b: &MinLoc| *a = a.min(*b));
    let pending = world
        .on(comm)
        .iallreduce(Record::wrap_vec(of(members[r])), least())?;
    let want: Vec<MinLoc> = (0..len)
        .map(|i| {
            members
                .iter()
                .map(|&w| loc(w, i))
                .reduce(MinLoc::min)
                .expect("a member")
        })
        .collect();
    let got = Record::unwrap_vec(world.wait(pending)?);
    t.expect(&format!("{name}: iallreduce of records"), got, want);
    // "The later one unless its value is larger": associative, not
    // commutative, so only rank order gives the reference.
    let later = |a: &mut MinLoc, b: &MinLoc| {
        if b.value <= a.value {
            *a = *b
        }
    };
    let fold = |ranks: &[u32]| -> Vec<MinLoc> {
        (0..len)
            .map(|i| {
                let mut acc = loc(ranks[0], i);
                for &w in &ranks[1..] {
                    later(&mut acc, &loc(w, i));
                }
                acc
            })
            .collect()
    };
    let mut v = of(members[r]);
    world.on(comm).scan_with(&mut v, later)?;
    t.expect(
        &format!("{name}: scan_with in rank order"),
        v,
        fold(&members[..=r]),
    );
    let got = world.on(comm).exscan_with(&of(members[r]), later)?;
    t.expect(
        &format!("{name}: exscan_with in rank order"),
        got,
        (r > 0).then(|| fold(&members[..r])),
    );
    let mut bad = vec![Record(loc(members[r], 0))];
    match world.on(comm).allreduce(&mut bad, Op::Sum) {
        Err(fabric_msg::Error::Usage(m)) => t.expect(
            &format!("{name}: Op::Sum on records is refused with what to do"),
            m.contains("Reduction::records"),
            true,
        ),
        other => t
            .failed
            .push(format!("{name}: Op::Sum on records gave {other:?}")),
    }
    let (right, left) = (((r + 1) % n) as u32, ((r + n - 1) % n) as u32);
    let mut view = world.on(comm);
    let reqs = vec![
        view.irecv(Some(left), Some(9), vec![Record(MinLoc::default()); len])?,
        view.isend(right, 9, &Record::wrap_vec(of(members[r])))?,
    ];
    let done = world.wait_all(reqs)?;
    let got = Record::unwrap_vec(done[0].clone());
    t.expect(
        &format!("{name}: records as typed messages"),
        got,
        of(members[left as usize]),
    );
    Ok(())
}
