//! fabric-msg's own same-node transport (`transport::node`): ranks of one
//! node as threads of this process, each with its own `NodeLoop` and
//! segment, attached to each other through `/proc/self/fd` exactly as
//! separate processes attach (the two-process run is
//! `examples/tests/node_pingpong.rs`).

use fabric_msg::transport::event_loop::{CompletionError, OpKind, Token};
use fabric_msg::transport::node::{NodeCompletion, NodeConfig, NodeLoop, SegmentName};
use fabric_msg::Buffer;
use std::time::{Duration, Instant};

/// `ranks` connected loops.
fn node(ranks: usize, cfg: NodeConfig) -> Vec<NodeLoop> {
    let mut loops: Vec<NodeLoop> = (0..ranks)
        .map(|r| NodeLoop::create(r, ranks, cfg).unwrap())
        .collect();
    let names: Vec<SegmentName> = loops.iter().map(NodeLoop::name).collect();
    for l in &mut loops {
        for (p, n) in names.iter().enumerate() {
            l.connect(p, n).unwrap();
        }
    }
    loops
}

/// Poll until `n` completions come, or fail after 10 s.
fn wait_for(l: &mut NodeLoop, n: usize) -> Vec<NodeCompletion> {
    let mut out = Vec::new();
    let until = Instant::now() + Duration::from_secs(10);
    while out.len() < n {
        if l.poll(&mut out) == 0 {
            // Let the peer's thread run where threads share a core (and
            // under valgrind, which runs one thread at a time).
            std::thread::yield_now();
        }
        assert!(
            out.len() >= n || Instant::now() < until,
            "only {} of {n} completions in 10 s",
            out.len()
        );
    }
    out
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect()
}

/// Every message through the ring, and (the default) from 32 KiB read
/// from the sender's memory.
fn configs() -> impl Iterator<Item = NodeConfig> {
    [
        NodeConfig {
            single_copy_from: usize::MAX,
            ..NodeConfig::default()
        },
        NodeConfig::default(),
    ]
    .into_iter()
}

/// Sizes: empty, one cell, one frame, just over, several frames, larger
/// than the ring (streams through it while the receiver reads).
const SIZES: [usize; 8] = [0, 8, 31, 200, 16 << 10, (16 << 10) + 1, 100_000, 1 << 20];

#[test]
fn every_size_arrives_whole_whether_the_receive_comes_first_or_last() {
    for (receive_first, cfg) in [true, false]
        .into_iter()
        .flat_map(|r| configs().map(move |c| (r, c)))
    {
        let mut l = node(2, cfg);
        let (mut a, mut b) = (l.remove(0), l.remove(0));
        let t = std::thread::spawn(move || {
            for (i, &n) in SIZES.iter().enumerate() {
                a.send(
                    1,
                    i as u64,
                    Buffer::from_slice(&pattern(n, i as u64)),
                    Token(i as u64),
                )
                .unwrap();
                let c = wait_for(&mut a, 1);
                assert_eq!(
                    (c[0].kind, c[0].token, c[0].peer),
                    (OpKind::Send, Token(i as u64), 1)
                );
            }
            a
        });
        if !receive_first {
            std::thread::sleep(Duration::from_millis(50));
        }
        for (i, &n) in SIZES.iter().enumerate() {
            b.recv(Some(0), i as u64, 0, Buffer::new(n + 3), Token(100 + i as u64))
                .unwrap();
            let c = wait_for(&mut b, 1);
            assert_eq!(c[0].result, Ok(()), "size {n}");
            assert_eq!(
                (c[0].token, c[0].peer, c[0].tag),
                (Token(100 + i as u64), 0, i as u64)
            );
            assert!(
                c[0].buffer.as_slice() == pattern(n, i as u64),
                "size {n}, receive first: {receive_first}"
            );
        }
        t.join().unwrap();
        assert_eq!(b.pending(), (0, 0, 0));
    }
}

#[test]
fn a_message_larger_than_its_receive_is_truncated_and_the_next_one_still_arrives() {
    for cfg in configs() {
        let mut l = node(2, cfg);
        for &n in &SIZES[1..] {
            for receive_first in [true, false] {
                let small = n / 2;
                if receive_first {
                    l[1].recv(Some(0), 5, 0, Buffer::new(small), Token(1)).unwrap();
                }
                l[0].send(1, 5, Buffer::from_slice(&pattern(n, 1)), Token(1))
                    .unwrap();
                l[0].send(1, 6, Buffer::from_slice(&pattern(64, 2)), Token(2))
                    .unwrap();
                let (mut sent, until) = (Vec::new(), Instant::now() + Duration::from_secs(10));
                if !receive_first {
                    // Let both messages land unexpected first (a large one as
                    // its request: its send completes only once it is read).
                    while l[1].pending().2 < 2 {
                        l[0].poll(&mut sent);
                        l[1].poll(&mut Vec::new());
                        assert!(Instant::now() < until);
                    }
                    l[1].recv(Some(0), 5, 0, Buffer::new(small), Token(1)).unwrap();
                }
                l[1].recv(Some(0), 6, 0, Buffer::new(64), Token(2)).unwrap();
                let mut got = Vec::new();
                while got.len() < 2 || sent.len() < 2 {
                    l[0].poll(&mut sent);
                    l[1].poll(&mut got);
                    assert!(Instant::now() < until, "size {n}: {got:?} {sent:?}");
                }
                assert!(
                    sent.iter().all(|c| c.result.is_ok()),
                    "a truncated message is the receiver's error only"
                );
                assert_eq!(
                    got[0].result,
                    Err(CompletionError::Truncated {
                        message_len: Some(n),
                        buffer_len: small
                    }),
                    "size {n}"
                );
                assert!(got[0].buffer.as_slice() == &pattern(n, 1)[..small]);
                assert_eq!(got[1].result, Ok(()));
                assert!(got[1].buffer.as_slice() == pattern(64, 2));
            }
        }
    }
}

#[test]
fn matching_follows_mpi_order_across_sources_tags_and_masks() {
    let mut l = node(
        4,
        NodeConfig {
            cells: 64,
            max_frame: 512,
            single_copy_from: 1500,
        },
    );
    // Ranks 1..3 each send 30 messages to rank 0, tags alternating 10/11,
    // sizes through several frames; all unexpected before rank 0 posts.
    for (s, rank) in l.iter_mut().enumerate().skip(1) {
        for i in 0..30u64 {
            let tag = 10 + i % 2;
            let body = pattern(((i * 97) % 2000) as usize, s as u64 * 1000 + i);
            rank.send(0, tag, Buffer::from_slice(&body), Token(i)).unwrap();
        }
    }
    let until = Instant::now() + Duration::from_secs(10);
    let mut seen: Vec<Vec<u64>> = vec![Vec::new(); 4];
    let mut last_index = [[None::<u64>; 2]; 4];
    let mut posted = 0u64;
    let mut got = Vec::new();
    while seen.iter().map(Vec::len).sum::<usize>() < 90 {
        for rank in &mut l[1..] {
            rank.poll(&mut Vec::new());
        }
        // Receives by turns: tag 10 from any rank (with bits outside the
        // low byte ignored, and set in the receive's tag), and tag 11
        // from ranks 1, 2, 3 in turn.
        if posted < 90 && l[0].pending().1 < 4 {
            let (from, tag, ignore) = if posted % 2 == 0 {
                (None, 0x500 | 10, 0xF00)
            } else {
                (Some(1 + (posted / 2 % 3) as usize), 11, 0)
            };
            l[0].recv(from, tag, ignore, Buffer::new(2000), Token(posted))
                .unwrap();
            posted += 1;
        }
        got.clear();
        l[0].poll(&mut got);
        for c in &got {
            assert_eq!(c.result, Ok(()));
            seen[c.peer].push(c.tag);
            // The payload names the message's index at its sender.
            let idx = (0..30u64)
                .find(|&k| {
                    pattern(((k * 97) % 2000) as usize, c.peer as u64 * 1000 + k) == c.buffer.as_slice()
                })
                .expect("a payload that was sent");
            assert_eq!(10 + idx % 2, c.tag);
            // One source's messages with one tag come in the order sent.
            let last = &mut last_index[c.peer][(c.tag - 10) as usize];
            assert!(
                last.map_or(true, |l| l < idx),
                "rank {}: message {idx} after {last:?}",
                c.peer
            );
            *last = Some(idx);
        }
        if Instant::now() > until {
            panic!(
                "stuck: {:?} pending {:?}",
                seen.iter().map(Vec::len).collect::<Vec<_>>(),
                l[0].pending()
            );
        }
    }
    for (s, tags) in seen.iter().enumerate().skip(1) {
        assert_eq!(tags.len(), 30, "rank {s}");
    }
}

#[test]
fn per_source_order_is_kept_for_messages_that_match_the_same_receive() {
    // Sends and receives interleaved: some messages meet a posted receive,
    // some arrive unexpected, some are claimed while still streaming in,
    // some (from 300 bytes) are read from the sender's memory.
    let mut l = node(
        2,
        NodeConfig {
            cells: 16,
            max_frame: 256,
            single_copy_from: 300,
        },
    );
    let mut got = Vec::new();
    let mut posted = 0u64;
    let until = Instant::now() + Duration::from_secs(10);
    let mut sent = 0u64;
    while got.len() < 200 {
        if sent < 200 {
            let body = sent.to_ne_bytes().repeat((sent % 50) as usize + 1);
            l[1].send(0, 7, Buffer::from_slice(&body), Token(sent)).unwrap();
            sent += 1;
        }
        if posted < 200 && (sent % 3 == 0 || sent == 200) {
            l[0].recv(None, 7, 0, Buffer::new(400), Token(posted)).unwrap();
            posted += 1;
        }
        l[1].poll(&mut Vec::new());
        l[0].poll(&mut got);
        assert!(Instant::now() < until, "{} of 200", got.len());
    }
    let order: Vec<u64> = got
        .iter()
        .map(|c| u64::from_ne_bytes(c.buffer.as_slice()[..8].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..200).collect::<Vec<_>>());
    let tokens: Vec<u64> = got.iter().map(|c| c.token.0).collect();
    assert_eq!(
        tokens,
        (0..200).collect::<Vec<_>>(),
        "receives complete in the order posted"
    );
}

#[test]
fn a_cancelled_receive_gives_its_buffer_back_and_takes_nothing() {
    let mut l = node(2, NodeConfig::default());
    l[0].recv(Some(1), 3, 0, Buffer::new(16), Token(9)).unwrap();
    let b = l[0].cancel_recv(Token(9)).expect("not matched yet");
    assert_eq!(b.capacity(), 16);
    assert!(l[0].cancel_recv(Token(9)).is_none());
    assert!(l[1].inject(0, 3, b"after").unwrap());
    l[0].recv(Some(1), 3, 0, Buffer::new(16), Token(10)).unwrap();
    let c = wait_for(&mut l[0], 1);
    assert_eq!((c[0].token, c[0].buffer.as_slice()), (Token(10), &b"after"[..]));
}

/// A paired receive (the World's receive from any rank, whose other part
/// waits on the fabric) takes no message until its owner answers; the
/// message and every one behind it from that rank wait in the ring. Taken
/// back, the message goes to the next receive that matches it, and the
/// rank's order holds: a receive for any tag posted after a paired one
/// for tag 0 that skipped an earlier tag-2 message gets that one first.
#[test]
fn a_paired_receive_waits_for_its_owner_and_a_refused_one_passes_messages_on_in_order() {
    for (refuse, single_copy_from) in [(true, usize::MAX), (false, usize::MAX), (true, 300), (false, 300)] {
        let cfg = NodeConfig {
            single_copy_from,
            ..NodeConfig::default()
        };
        let mut l = node(2, cfg);
        // Receive 0, paired, for tag 0; receive 1 for any tag; receive 2
        // for any tag.
        let now = l[0].recv_paired(0, 0, Buffer::new(4096), Token(0)).unwrap();
        assert!(!now, "nothing has arrived yet");
        l[0].recv(None, 0, u64::MAX, Buffer::new(4096), Token(1)).unwrap();
        // Rank 1 sends m0 with tag 2, m1 with tag 0 (1,000 bytes: by
        // single copy where it starts at 300), m2 with tag 0.
        for (i, (tag, len)) in [(2u64, 8usize), (0, 1000), (0, 8)].into_iter().enumerate() {
            let body = vec![i as u8; len];
            l[1].send(0, tag, Buffer::from_slice(&body), Token(i as u64))
                .unwrap();
        }
        let mut sends = Vec::new();
        l[1].poll(&mut sends);
        // m0 skips receive 0 (tag 2) for receive 1; m1 would go to
        // receive 0: asked, and nothing more moves.
        let got = wait_for(&mut l[0], 1);
        assert_eq!(
            (got[0].token, got[0].buffer.as_slice()),
            (Token(1), &[0u8; 8][..])
        );
        let mut asked = Vec::new();
        for _ in 0..10 {
            assert_eq!(l[0].poll(&mut Vec::new()), 0, "nothing moves before the answer");
            l[0].take_asked(&mut asked);
        }
        asked.dedup();
        assert_eq!(
            asked,
            vec![Token(0)],
            "asked about receive 0 alone, at every look"
        );
        l[0].recv(None, 0, u64::MAX, Buffer::new(4096), Token(2)).unwrap();
        let (first, second) = if refuse {
            let b = l[0]
                .cancel_recv(Token(0))
                .expect("the paired receive is still posted");
            assert_eq!(b.capacity(), 4096);
            l[0].recv(None, 0, u64::MAX, Buffer::new(4096), Token(3)).unwrap();
            (Token(2), Token(3))
        } else {
            assert!(l[0].unpair(Token(0)));
            (Token(0), Token(2))
        };
        let got = wait_for(&mut l[0], 2);
        let seen: Vec<(Token, usize, u8)> = got
            .iter()
            .map(|c| (c.token, c.buffer.len(), c.buffer.as_slice()[0]))
            .collect();
        assert_eq!(seen, vec![(first, 1000, 1), (second, 8, 2)], "refused: {refuse}");
        let until = Instant::now() + Duration::from_secs(10);
        while sends.len() < 3 {
            l[1].poll(&mut sends);
            l[0].poll(&mut Vec::new());
            assert!(
                Instant::now() < until,
                "{} of 3 sends done (refused: {refuse})",
                sends.len()
            );
        }
        assert!(sends.iter().all(|c| c.result.is_ok()));
    }
}

/// A paired receive that a message already waits for takes it at once:
/// its other part need not be posted.
#[test]
fn a_paired_receive_takes_a_message_that_came_before_it() {
    let mut l = node(2, NodeConfig::default());
    assert!(l[1].inject(0, 5, b"early").unwrap());
    let until = Instant::now() + Duration::from_secs(10);
    while l[0].pending().2 == 0 {
        l[0].poll(&mut Vec::new());
        assert!(Instant::now() < until, "the message never arrived");
    }
    assert!(l[0].recv_paired(5, 0, Buffer::new(16), Token(7)).unwrap());
    let c = wait_for(&mut l[0], 1);
    assert_eq!((c[0].token, c[0].buffer.as_slice()), (Token(7), &b"early"[..]));
}

#[test]
fn ranks_that_disagree_on_the_layout_are_refused_with_a_reason() {
    let mut a = NodeLoop::create(0, 2, NodeConfig::default()).unwrap();
    let b = NodeLoop::create(1, 3, NodeConfig::default()).unwrap();
    let e = a.connect(1, &b.name()).unwrap_err().to_string();
    assert!(e.contains("disagree"), "{e}");
    let c = NodeLoop::create(
        1,
        2,
        NodeConfig {
            cells: 512,
            ..NodeConfig::default()
        },
    )
    .unwrap();
    assert!(a.connect(1, &c.name()).is_err());
    let e = a.send(1, 0, Buffer::new(1), Token(0)).unwrap_err().to_string();
    assert!(e.contains("not connected"), "{e}");
    assert!(a.inject(0, 0, &vec![0; (16 << 10) + 1]).is_err());
}

#[test]
fn a_full_ring_makes_sends_wait_not_fail_and_inject_say_no() {
    let mut l = node(
        2,
        NodeConfig {
            cells: 16,
            max_frame: 256,
            ..NodeConfig::default()
        },
    );
    let mut injected = 0;
    while l[0].inject(1, 1, &[1; 100]).unwrap() {
        injected += 1;
    }
    assert_eq!(
        injected, 5,
        "16 cells of 64 bytes take five 100-byte frames (3 cells each)"
    );
    l[0].send(1, 2, Buffer::from_slice(&[2; 1000]), Token(1)).unwrap();
    assert!(
        wait_quiet(&mut l[0]).is_empty(),
        "the send completed into a full ring"
    );
    for _ in 0..5 {
        l[1].recv(Some(0), 1, 0, Buffer::new(100), Token(0)).unwrap();
    }
    l[1].recv(Some(0), 2, 0, Buffer::new(1000), Token(1)).unwrap();
    let (mut sent, mut got, until) = (Vec::new(), Vec::new(), Instant::now() + Duration::from_secs(10));
    while got.len() < 6 {
        l[0].poll(&mut sent);
        l[1].poll(&mut got);
        assert!(Instant::now() < until);
    }
    assert_eq!(sent.len(), 1);
    assert!(got.iter().all(|c| c.result.is_ok()));
    assert!(got[5].buffer.as_slice() == [2; 1000]);
}

fn wait_quiet(l: &mut NodeLoop) -> Vec<NodeCompletion> {
    let mut out = Vec::new();
    for _ in 0..1000 {
        l.poll(&mut out);
    }
    out
}

#[test]
fn a_forged_single_copy_request_fails_the_receive_not_the_process() {
    use fabric_msg::transport::node::ring::{ring_bytes, Producer, FIRST, LAST, RNDV};
    use fabric_msg::transport::node::segment::HEADER;
    use fabric_msg::transport::node::Segment;
    use std::sync::Arc;
    let cfg = NodeConfig::default();
    let mut l = node(3, cfg);
    // Rank 2's ring into rank 1, written by hand: a request to read 4 KiB
    // at address 8 of rank 2's process (this one), numbered 77.
    let seg = Arc::new(Segment::attach(&l[1].name()).unwrap());
    let mut forger = Producer::new(seg, HEADER + 2 * ring_bytes(cfg.cells), cfg.cells, cfg.max_frame);
    let mut req = [0u8; 16];
    req[..8].copy_from_slice(&8u64.to_ne_bytes());
    req[8..].copy_from_slice(&77u64.to_ne_bytes());
    assert!(forger.try_write(4, FIRST | LAST | RNDV, 4096, &req));
    l[1].recv(Some(2), 4, 0, Buffer::new(4096), Token(1)).unwrap();
    let c = wait_for(&mut l[1], 1);
    assert_eq!(
        c[0].result,
        Err(CompletionError::CopyFailed {
            peer: 2,
            errno: libc::EFAULT
        })
    );
    // Rank 2 gets an ack for a send it never made: it stops reading rank
    // 1's ring and says why, and rank 1 can still talk to rank 0.
    wait_quiet(&mut l[2]);
    let e = l[2].send(1, 0, Buffer::new(8), Token(0)).unwrap_err().to_string();
    assert!(e.contains("does not wait"), "{e}");
    assert!(l[1].inject(0, 9, b"still").unwrap());
    l[0].recv(Some(1), 9, 0, Buffer::new(8), Token(2)).unwrap();
    let c = wait_for(&mut l[0], 1);
    assert_eq!(c[0].buffer.as_slice(), b"still");
}
