//! Multi-receive buffers through the tokio adapter (`LoopHandle::recv_multi`
//! and its `MultiRecv`), on tcp;ofi_rxm and shm: a stream of messages
//! through two buffers taking turns arrives once each and in order, every
//! piece readable; a `MultiRecv` dropped with its buffer posted cancels
//! it, so later messages go to later receives; a loop closed under a
//! waiting stream says so once.
#![cfg(feature = "tokio")]

use crate::common;

use common::multi_recv_pair;
use fabric_msg::async_loop::{AsyncLoop, LoopHandle, MultiRecv};
use fabric_msg::{Buffer, Completion, EndpointId, Error, Peer, RecvOpts, SendOpts};
use std::time::Duration;

/// Two loops for untagged messages into multi-receive buffers (at least
/// 64 bytes of room left for a buffer to stay posted), each behind an
/// AsyncLoop: (ours, our endpoint), (theirs, the peer as they see us).
fn connected(provider: &str) -> ((LoopHandle, EndpointId), (LoopHandle, Peer)) {
    let (me, them) = multi_recv_pair(provider);
    (
        (AsyncLoop::start(me.ev), me.ep),
        (AsyncLoop::start(them.ev), them.peer),
    )
}

/// Message `i`: its number, then 32 bytes of 7.
fn message(i: u64) -> Vec<u8> {
    [&i.to_le_bytes()[..], &[7u8; 32]].concat()
}

/// The next completion of `s`, within the tests' time.
async fn next(s: &mut MultiRecv, what: &str) -> Option<fabric_msg::Result<Completion>> {
    tokio::time::timeout(common::TIMEOUT, s.next())
        .await
        .unwrap_or_else(|_| panic!("{what}: no completion of a multi-receive buffer within the time"))
}

/// 300 messages of 40 bytes through two 1 KiB buffers that take turns
/// (each holds about 25): each piece read while its buffer may still be
/// posted, or from the buffer once it is back; every message once and in
/// order, and each buffer posted again as it comes back.
async fn stream(provider: &str) {
    const N: u64 = 300;
    let ((a, a_ep), (b, b_peer)) = connected(provider);
    let sender = tokio::spawn(async move {
        for i in 0..N {
            let c = b
                .send(b_peer, Buffer::from_slice(&message(i)), SendOpts::default())
                .await
                .unwrap();
            c.result.unwrap();
        }
        b
    });
    let mut turns = [
        a.recv_multi(a_ep, Buffer::new(1024)).await.unwrap(),
        a.recv_multi(a_ep, Buffer::new(1024)).await.unwrap(),
    ];
    let mut seen = Vec::new();
    let mut through_loop = 0;
    let mut turn = 0;
    while (seen.len() as u64) < N {
        let c = next(&mut turns[turn], provider)
            .await
            .unwrap_or_else(|| panic!("{provider}: a stream ended before its buffer came back"))
            .unwrap();
        c.result.as_ref().unwrap();
        if let Some((offset, len)) = c.multi {
            let bytes = match turns[turn].bytes(&c, <[u8]>::to_vec) {
                Some(b) => {
                    through_loop += 1;
                    b
                }
                None => c
                    .buffer
                    .as_ref()
                    .expect("a piece that cannot be read must carry the buffer")
                    .as_slice()[offset..offset + len]
                    .to_vec(),
            };
            let i = u64::from_le_bytes(bytes[..8].try_into().unwrap());
            assert_eq!(bytes, message(i), "{provider}: message {i}'s bytes");
            seen.push(i);
        }
        if let Some(buf) = c.buffer {
            // The last completion of this buffer: nothing more comes from it.
            assert!(
                turns[turn].next().await.is_none(),
                "{provider}: a stream went on after its buffer came back"
            );
            turns[turn] = a.recv_multi(a_ep, buf).await.unwrap();
            turn = 1 - turn;
        }
    }
    assert_eq!(
        seen,
        (0..N).collect::<Vec<_>>(),
        "{provider}: every message once, in order"
    );
    assert!(
        through_loop > 0,
        "{provider}: no piece was read while its buffer was still posted"
    );
    let b = sender.await.unwrap();
    drop((turns, a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_through_two_buffers_arrives_once_and_in_order_on_tcp_rxm() {
    stream("tcp;ofi_rxm").await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_stream_through_two_buffers_arrives_once_and_in_order_on_shm() {
    stream("shm").await;
}

/// Three messages into a buffer, taken; the `MultiRecv` dropped with its
/// buffer still posted; three more go to a plain receive posted after, in
/// order, and nothing arrives twice.
async fn dropped(provider: &str) {
    let ((a, a_ep), (b, b_peer)) = connected(provider);
    let send = |i: u64| {
        let b = b.clone();
        async move {
            b.send(b_peer, Buffer::from_slice(&message(i)), SendOpts::default())
                .await
                .unwrap()
                .result
                .unwrap()
        }
    };
    let mut s = a.recv_multi(a_ep, Buffer::new(4096)).await.unwrap();
    for i in 0..3 {
        send(i).await;
        let c = next(&mut s, provider).await.unwrap().unwrap();
        c.result.as_ref().unwrap();
        assert_eq!(
            s.bytes(&c, |b| b == message(i)),
            Some(true),
            "{provider}: piece {i}"
        );
    }
    drop(s);
    for i in 3..6 {
        send(i).await;
    }
    for i in 3..6 {
        let c = tokio::time::timeout(
            common::TIMEOUT,
            a.recv(a_ep, Buffer::new(64), RecvOpts::default()),
        )
        .await
        .unwrap_or_else(|_| panic!("{provider}: message {i} went into the dropped buffer"))
        .unwrap();
        c.result.unwrap();
        assert_eq!(
            c.buffer.unwrap().as_slice(),
            message(i),
            "{provider}: after the drop"
        );
    }
    let extra = tokio::time::timeout(
        Duration::from_millis(100),
        a.recv(a_ep, Buffer::new(64), RecvOpts::default()),
    )
    .await;
    assert!(extra.is_err(), "{provider}: a message arrived twice: {extra:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_multi_recv_is_cancelled_on_tcp_rxm() {
    dropped("tcp;ofi_rxm").await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_dropped_multi_recv_is_cancelled_on_shm() {
    dropped("shm").await;
}

/// A stream awaiting its next piece when the loop is closed: `Closed`
/// once, then the end.
#[tokio::test(flavor = "current_thread")]
async fn a_closed_loop_ends_a_waiting_stream() {
    let ((a, a_ep), _them) = connected("tcp;ofi_rxm");
    let mut s = a.recv_multi(a_ep, Buffer::new(1024)).await.unwrap();
    let closer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        a.close().await;
    });
    match next(&mut s, "closed").await {
        Some(Err(Error::Closed { .. })) => {}
        other => panic!("a stream under a closed loop gave {other:?}"),
    }
    assert!(s.next().await.is_none(), "a closed stream went on");
    closer.await.unwrap();
}
