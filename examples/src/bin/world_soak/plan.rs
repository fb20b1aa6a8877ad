//! What every rank of a `world_soak` round draws alike from the seed:
//! the messages (who sends what to whom, of which size and tag), their
//! contents, how the receives name them, and the round's settings.

use fabric_msg_examples::rng::Rng;

/// Message sizes, in `u64` elements: 8 B, 64 B, 1 KiB, 9 KB, 40 KB, 200 KB.
const SIZES: [usize; 6] = [1, 8, 128, 1125, 5000, 25_000];
pub(crate) const LARGEST: usize = 25_000;
const TAGS: u32 = 3;

/// A size class, small ones more often.
fn draw_size(rng: &mut Rng) -> usize {
    SIZES[match rng.below(16) {
        0..=4 => 0,
        5..=7 => 1,
        8..=9 => 2,
        10..=11 => 3,
        12..=14 => 4,
        _ => 5,
    }]
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Msg {
    pub(crate) src: u32,
    /// Its place among the messages from `src` to this destination.
    pub(crate) seq: u32,
    pub(crate) tag: u32,
    pub(crate) len: usize,
}

/// A message's first element: who, when, which.
pub(crate) fn id(src: u32, round: u32, seq: u32) -> u64 {
    (u64::from(src) << 44) | (u64::from(round) << 20) | u64::from(seq)
}

/// Element `i` of the message `id`.
pub(crate) fn word(id: u64, i: usize) -> u64 {
    if i == 0 {
        id
    } else {
        (id ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).rotate_left((i % 63) as u32 + 1)
    }
}

/// How the receives of a round name their messages.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Naming {
    /// Rank and tag; some receives too small on purpose.
    Exact,
    /// Rank and tag, then rank and any tag, then any: each level posted
    /// after the one before, so every message finds a receive.
    BySource,
    /// Rank and tag, then any rank with the tag, then any.
    ByTag,
    /// Any rank, any tag.
    Any,
}

/// One receive as posted: what it names, what it must get (`Exact`
/// only), its room.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Recv {
    pub(crate) from: Option<u32>,
    pub(crate) tag: Option<u32>,
    pub(crate) room: usize,
    /// The message it must get, where that is known (a receive by rank
    /// and tag posted first gets that pair's messages in order).
    pub(crate) expect: Option<(u32, u32)>,
}

impl Recv {
    pub(crate) fn matches(&self, m: &Msg) -> bool {
        self.from.map_or(true, |f| f == m.src) && self.tag.map_or(true, |t| t == m.tag)
    }
}

/// The round's messages, by destination then source, in send order.
pub(crate) fn plan_messages(rng: &mut Rng, size: u32) -> Vec<Vec<Vec<Msg>>> {
    let mut to = vec![vec![Vec::new(); size as usize]; size as usize];
    for (dst, from) in to.iter_mut().enumerate() {
        for (src, list) in from.iter_mut().enumerate() {
            if src == dst {
                continue;
            }
            for seq in 0..rng.below(4) as u32 {
                list.push(Msg {
                    src: src as u32,
                    seq,
                    tag: rng.below(u64::from(TAGS)) as u32,
                    len: draw_size(rng),
                });
            }
        }
    }
    to
}

/// The receives `me` posts for `incoming`, in posting order. `named`:
/// every receive names a tag (see [`Opts::named`](crate::Opts::named)): where a receive would
/// name no tag, it names its message's tag from any rank instead.
pub(crate) fn plan_receives(rng: &mut Rng, naming: Naming, named: bool, incoming: &[Msg]) -> Vec<Recv> {
    let mut levels: [Vec<Recv>; 3] = Default::default();
    for m in incoming {
        let level = match naming {
            Naming::Exact => 0,
            Naming::Any => 2,
            Naming::BySource | Naming::ByTag => rng.below(3) as usize,
        };
        let (from, tag) = match (naming, level) {
            (_, 0) => (Some(m.src), Some(m.tag)),
            (Naming::BySource, 1) if !named => (Some(m.src), None),
            (Naming::ByTag, 1) => (None, Some(m.tag)),
            _ if named => (None, Some(m.tag)),
            _ => (None, None),
        };
        levels[level].push(Recv {
            from,
            tag,
            room: LARGEST,
            expect: None,
        });
    }
    // The first level's receives of one pair get its messages in order,
    // whatever else is posted: a few are made too small.
    levels[0].sort_by_key(|r| (r.from, r.tag));
    let mut taken = vec![false; incoming.len()];
    for r in &mut levels[0] {
        let pair = (r.from.unwrap_or(0), r.tag.unwrap_or(0));
        let k = incoming
            .iter()
            .enumerate()
            .filter(|(_, m)| (m.src, m.tag) == pair)
            .map(|(i, _)| i)
            .find(|&i| !taken[i]);
        if let Some(i) = k {
            taken[i] = true;
            r.expect = Some((incoming[i].src, incoming[i].seq));
            let len = incoming[i].len;
            r.room = if naming == Naming::Exact && len > 1 && rng.chance(10) {
                len / 2
            } else {
                len + rng.below(3) as usize
            };
        }
    }
    // Within a level the order is free, but each pair's receives keep
    // their order: shuffle the pairs' turns.
    let first = std::mem::take(&mut levels[0]);
    let mut by_pair: Vec<(Option<u32>, Option<u32>)> = Vec::new();
    let mut queues: Vec<std::collections::VecDeque<Recv>> = Vec::new();
    for r in first {
        match by_pair.iter().position(|p| *p == (r.from, r.tag)) {
            Some(i) => queues[i].push_back(r),
            None => {
                by_pair.push((r.from, r.tag));
                queues.push([r].into());
            }
        }
    }
    let mut out = Vec::new();
    while queues.iter().any(|q| !q.is_empty()) {
        let live: Vec<usize> = (0..queues.len()).filter(|&i| !queues[i].is_empty()).collect();
        let q = live[rng.below(live.len() as u64) as usize];
        out.extend(queues[q].pop_front());
    }
    for mut level in levels.into_iter().skip(1) {
        rng.shuffle(&mut level);
        out.extend(level);
    }
    out
}

/// What a rank's contribution to a round's collectives is.
pub(crate) fn contribution(round: u32, rank: u32, i: usize) -> u64 {
    u64::from(round) * 1_000_003 + u64::from(rank) * 7919 + i as u64
}

/// A round's draws start here.
pub(crate) fn rng_of(seed: u64, round: u32) -> Rng {
    Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ u64::from(round))
}

/// How a round names its receives, when it sends (before, between, after
/// the receives), how it waits (`wait`, `wait_any`, `test`), and how many
/// of its receives from any rank are matched probes.
pub(crate) fn settings(seed: u64, round: u32) -> (Naming, u64, u64, usize) {
    let mut rng = rng_of(seed, round);
    (
        [Naming::Exact, Naming::BySource, Naming::ByTag, Naming::Any][rng.below(4) as usize],
        rng.below(3),
        rng.below(3),
        rng.below(4) as usize,
    )
}
