//! The owned objects on a real provider (`tcp;ofi_rxm`, and `shm`): each
//! opens from its parents, and closes cleanly whatever order the handles
//! are dropped in, because each holds what it needs.

use super::{getinfo, Av, Cq, Domain, Endpoint, Eq, Fabric, Hints, Info, InfoList, PassiveEndpoint};
use crate::error::Error;
use crate::ffi;
use std::ptr;

fn list(provider: &str, ep_type: ffi::fi_ep_type) -> Option<InfoList> {
    let hints = Hints {
        caps: (ffi::FI_MSG | ffi::FI_TAGGED) as u64,
        endpoint_type: Some(ep_type),
        provider: Some(provider.into()),
        ..Default::default()
    };
    match getinfo(&hints) {
        Ok(l) => Some(l),
        Err(Error::NoData { .. }) => {
            eprintln!("SKIPPED: libfabric offers no {provider} here (FI_ENODATA)");
            None
        }
        Err(e) => panic!("fi_getinfo for {provider}: {e}"),
    }
}

fn endpoint_outlives_its_handles(provider: &str) {
    let Some(list) = list(provider, ffi::FI_EP_RDM) else {
        return;
    };
    let info = list.nth(0).expect("fi_getinfo returns at least one entry");
    let fabric = Fabric::open(info).unwrap();
    let domain = Domain::open(&fabric, info).unwrap();
    let cq = Cq::open(&domain, 64, true, false).unwrap();
    let av = Av::open(&domain, 4).unwrap();
    // SAFETY: no context.
    let mut ep = unsafe { Endpoint::open(&domain, info, ptr::null_mut()) }.unwrap();
    ep.bind_cq(&cq, u64::from(ffi::FI_TRANSMIT | ffi::FI_RECV))
        .unwrap();
    ep.bind_av(&av).unwrap();
    ep.enable().unwrap();
    let name = ep.name().unwrap();
    assert!(!name.is_empty(), "an enabled endpoint has a name");
    // The application's handles go first: the endpoint holds the CQ, AV,
    // domain and fabric, so its own close still succeeds (no -FI_EBUSY,
    // no use of a closed parent), and they close after it.
    drop((fabric, domain, cq, av));
    ep.close()
        .expect("closing the endpoint after its parents' handles");
}

#[test]
fn an_endpoint_holds_its_parents_tcp_rxm() {
    endpoint_outlives_its_handles("tcp;ofi_rxm");
}

#[test]
fn an_endpoint_holds_its_parents_shm() {
    endpoint_outlives_its_handles("shm");
}

#[test]
fn a_passive_endpoint_listens_and_an_info_copy_takes_a_destination() {
    let Some(list) = list("tcp", ffi::FI_EP_MSG) else {
        return;
    };
    let info = list.nth(0).expect("fi_getinfo returns at least one entry");
    let fabric = Fabric::open(info).unwrap();
    let eq = Eq::open(&fabric).unwrap();
    let mut pep = PassiveEndpoint::open(&fabric, info).unwrap();
    pep.bind_eq(&eq).unwrap();
    pep.listen().unwrap();
    let name = pep.name().unwrap();
    assert!(!name.is_empty());
    assert!(eq.try_next().unwrap().is_none(), "no connection request came");
    let mut copy = Info::dup(info).unwrap();
    copy.set_dest_addr(&name).unwrap();
    let got = copy.as_ref().get();
    assert_eq!(got.dest_addrlen, name.len());
    drop((fabric, eq));
    drop(pep);
}
