//! The World's own messages and collectives: those of the view of the
//! whole World ([`World::whole`]), so that a program that needs no
//! communicator writes `world.allreduce(..)`, and one that does writes
//! `world.on(&comm).allreduce(..)` with the same arguments.

use super::collectives::ops::{Element, Reduction};
use super::persistent::Persistent;
use super::probe::{Envelope, Matched};
use super::request::{Request, Status};
use super::World;
use crate::error::Result;
use bytemuck::Pod;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// For each method, a World method of the same signature that calls it on
/// the whole World's view.
macro_rules! on_the_whole_world {
    ($( fn $name:ident $(<$g:ident: $b:ident $(+ $more:ident)*>)? (&mut self $(, $arg:ident: $t:ty)* ) -> $ret:ty; )*) => {
        impl World {
            $(
                #[doc = concat!("[`CommView::", stringify!($name), "`](super::comm::CommView::", stringify!($name), ") on the whole World.")]
                pub fn $name $(<$g: $b $(+ $more)*>)? (&mut self $(, $arg: $t)*) -> $ret {
                    self.whole().$name($($arg),*)
                }
            )*
        }
    };
}

on_the_whole_world! {
    fn allgather<T: Element>(&mut self, mine: &[T]) -> Result<Vec<T>>;
    fn allgatherv<T: Element>(&mut self, mine: &[T], counts: &[usize]) -> Result<Vec<T>>;
    fn iallgatherv<T: Element>(&mut self, mine: Vec<T>, counts: &[usize]) -> Result<Request<T>>;
    fn allreduce<T: Element>(&mut self, data: &mut [T], op: impl Into<Reduction<T>>) -> Result<()>;
    fn iallreduce<T: Element>(&mut self, data: Vec<T>, op: impl Into<Reduction<T>>) -> Result<Request<T>>;
    fn barrier(&mut self) -> Result<()>;
    fn ibarrier(&mut self) -> Result<Request<u8>>;
    fn broadcast<T: Element>(&mut self, root: u32, data: &mut [T]) -> Result<()>;
    fn ibroadcast<T: Element>(&mut self, root: u32, data: Vec<T>) -> Result<Request<T>>;
    fn gather<T: Element>(&mut self, root: u32, mine: &[T]) -> Result<Vec<T>>;
    fn gatherv<T: Element>(&mut self, root: u32, mine: &[T], counts: &[usize]) -> Result<Vec<T>>;
    fn igatherv<T: Element>(&mut self, root: u32, mine: Vec<T>, counts: &[usize]) -> Result<Request<T>>;
    fn reduce<T: Element>(&mut self, root: u32, data: &mut [T], op: impl Into<Reduction<T>>) -> Result<()>;
    fn ireduce<T: Element>(&mut self, root: u32, data: Vec<T>, op: impl Into<Reduction<T>>) -> Result<Request<T>>;
    fn reduce_scatter<T: Element>(&mut self, data: &[T], counts: &[usize], op: impl Into<Reduction<T>>) -> Result<Vec<T>>;
    fn ireduce_scatter<T: Element>(&mut self, data: Vec<T>, counts: &[usize], op: impl Into<Reduction<T>>) -> Result<Request<T>>;
    fn scatter<T: Element>(&mut self, root: u32, data: &[T], n: usize) -> Result<Vec<T>>;
    fn iscatter<T: Element>(&mut self, root: u32, data: Vec<T>, n: usize) -> Result<Request<T>>;
    fn scatterv<T: Element>(&mut self, root: u32, data: &[T], counts: &[usize]) -> Result<Vec<T>>;
    fn iscatterv<T: Element>(&mut self, root: u32, data: Vec<T>, counts: &[usize]) -> Result<Request<T>>;
    fn alltoall<T: Element>(&mut self, data: &[T]) -> Result<Vec<T>>;
    fn ialltoall<T: Element>(&mut self, data: Vec<T>) -> Result<Request<T>>;
    fn alltoallv<T: Element>(&mut self, data: &[T], send_counts: &[usize], recv_counts: &[usize]) -> Result<Vec<T>>;
    fn ialltoallv<T: Element>(&mut self, data: Vec<T>, send_counts: &[usize], recv_counts: &[usize]) -> Result<Request<T>>;
    fn scan<T: Element>(&mut self, data: &mut [T], op: impl Into<Reduction<T>>) -> Result<()>;
    fn iscan<T: Element>(&mut self, data: Vec<T>, op: impl Into<Reduction<T>>) -> Result<Request<T>>;
    fn exscan<T: Element>(&mut self, data: &[T], op: impl Into<Reduction<T>>) -> Result<Option<Vec<T>>>;
    fn iexscan<T: Element>(&mut self, data: Vec<T>, op: impl Into<Reduction<T>>) -> Result<Request<T>>;
    fn reduce_scatter_block<T: Element>(&mut self, data: &[T], op: impl Into<Reduction<T>>) -> Result<Vec<T>>;
    fn ireduce_scatter_block<T: Element>(&mut self, data: Vec<T>, op: impl Into<Reduction<T>>) -> Result<Request<T>>;
    fn igather<T: Element>(&mut self, root: u32, mine: Vec<T>) -> Result<Request<T>>;
    fn iallgather<T: Element>(&mut self, mine: Vec<T>) -> Result<Request<T>>;
    fn send<T: Element>(&mut self, to: u32, tag: u32, data: &[T]) -> Result<()>;
    fn recv<T: Element>(&mut self, from: Option<u32>, tag: Option<u32>, data: &mut [T]) -> Result<Status>;
    fn isend<T: Element>(&mut self, to: u32, tag: u32, data: &[T]) -> Result<Request<T>>;
    fn irecv<T: Element>(&mut self, from: Option<u32>, tag: Option<u32>, buf: Vec<T>) -> Result<Request<T>>;
    fn send_value<V: Serialize>(&mut self, to: u32, tag: u32, value: &V) -> Result<()>;
    fn recv_value<V: DeserializeOwned>(&mut self, from: Option<u32>, tag: Option<u32>) -> Result<(V, Status)>;
    fn allreduce_with<S: Pod + Debug + PartialEq + Send + Sync>(&mut self, data: &mut [S], f: impl Fn(&mut S, &S) + Send + Sync + 'static) -> Result<()>;
    fn reduce_with<S: Pod + Debug + PartialEq + Send + Sync>(&mut self, root: u32, data: &mut [S], f: impl Fn(&mut S, &S) + Send + Sync + 'static) -> Result<()>;
    fn scan_with<S: Pod + Debug + PartialEq + Send + Sync>(&mut self, data: &mut [S], f: impl Fn(&mut S, &S) + Send + Sync + 'static) -> Result<()>;
    fn exscan_with<S: Pod + Debug + PartialEq + Send + Sync>(&mut self, data: &[S], f: impl Fn(&mut S, &S) + Send + Sync + 'static) -> Result<Option<Vec<S>>>;
    fn allreduce_init<T: Element>(&mut self, len: usize, op: impl Into<Reduction<T>>) -> Result<Persistent<T>>;
    fn broadcast_init<T: Element>(&mut self, root: u32, len: usize) -> Result<Persistent<T>>;
    fn barrier_init(&mut self) -> Result<Persistent<u8>>;
    fn reduce_init<T: Element>(&mut self, root: u32, len: usize, op: impl Into<Reduction<T>>) -> Result<Persistent<T>>;
    fn allgather_init<T: Element>(&mut self, len: usize) -> Result<Persistent<T>>;
    fn gather_init<T: Element>(&mut self, root: u32, len: usize) -> Result<Persistent<T>>;
    fn scatter_init<T: Element>(&mut self, root: u32, n: usize) -> Result<Persistent<T>>;
    fn alltoall_init<T: Element>(&mut self, len: usize) -> Result<Persistent<T>>;
    fn scan_init<T: Element>(&mut self, len: usize, op: impl Into<Reduction<T>>) -> Result<Persistent<T>>;
    fn exscan_init<T: Element>(&mut self, len: usize, op: impl Into<Reduction<T>>) -> Result<Persistent<T>>;
    fn reduce_scatter_block_init<T: Element>(&mut self, len: usize, op: impl Into<Reduction<T>>) -> Result<Persistent<T>>;
    fn iprobe(&mut self, from: Option<u32>, tag: Option<u32>) -> Result<Option<Envelope>>;
    fn probe(&mut self, from: Option<u32>, tag: Option<u32>) -> Result<Envelope>;
    fn improbe(&mut self, from: Option<u32>, tag: Option<u32>) -> Result<Option<Matched>>;
    fn mprobe(&mut self, from: Option<u32>, tag: Option<u32>) -> Result<Matched>;
    fn mrecv<T: Element>(&mut self, m: Matched) -> Result<Vec<T>>;
    fn mrecv_into<T: Element>(&mut self, m: Matched, data: &mut [T]) -> Result<Status>;
    fn mrecv_value<V: DeserializeOwned>(&mut self, m: Matched) -> Result<V>;
}
