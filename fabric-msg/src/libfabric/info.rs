//! `fi_info`: the lists `fi_getinfo` returns ([`InfoList`]), a borrowed
//! entry of one ([`InfoRef`]), and an owned single copy ([`Info`]: from
//! `fi_dupinfo`, or a connection request's).

use crate::error::{check, Error, Result};
use crate::ffi;
use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

/// An `fi_info` list owned by Rust; freed on drop.
pub(crate) struct InfoList(*mut ffi::fi_info);

// SAFETY: the list is plain memory libfabric allocated for us; it is read
// (never written) through `&self`, and freed once, in Drop.
unsafe impl Send for InfoList {}
// SAFETY: see Send.
unsafe impl Sync for InfoList {}

impl InfoList {
    /// Every entry, in libfabric's order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = InfoRef<'_>> {
        let mut cur = self.0;
        std::iter::from_fn(move || {
            let node = NonNull::new(cur)?;
            // SAFETY: cur is a node of the list this value owns; `next` is
            // NULL or the following node.
            cur = unsafe { (*cur).next };
            Some(InfoRef(node, PhantomData))
        })
    }

    /// Entry `n`, if the list has that many.
    pub(crate) fn nth(&self, n: usize) -> Option<InfoRef<'_>> {
        self.iter().nth(n)
    }
}

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the list came from fi_getinfo or fi_allocinfo and is freed once.
            unsafe { ffi::fi_freeinfo(self.0) }
        }
    }
}

/// One entry of an [`InfoList`], or an [`Info`], borrowed.
#[derive(Clone, Copy)]
pub(crate) struct InfoRef<'a>(NonNull<ffi::fi_info>, PhantomData<&'a ffi::fi_info>);

impl<'a> InfoRef<'a> {
    /// The entry, to read its fields (`FabricInfo::from_raw`) or to hand to
    /// an opening call. Valid for `'a`.
    pub(crate) fn as_ptr(self) -> *mut ffi::fi_info {
        self.0.as_ptr()
    }

    /// The entry's fields.
    pub(crate) fn get(self) -> &'a ffi::fi_info {
        // SAFETY: the entry lives for 'a (its list or owner is borrowed).
        unsafe { self.0.as_ref() }
    }

    /// Its source address (`src_addr`), or nothing.
    pub(crate) fn src_addr(self) -> Vec<u8> {
        let i = self.get();
        if i.src_addr.is_null() {
            return Vec::new();
        }
        // SAFETY: libfabric sets src_addr to src_addrlen readable bytes.
        unsafe { std::slice::from_raw_parts(i.src_addr.cast::<u8>(), i.src_addrlen).to_vec() }
    }
}

/// One `fi_info` owned by Rust: a copy (`fi_dupinfo`), or a connection
/// request's, which is ours to free. Freed on drop.
pub(crate) struct Info(NonNull<ffi::fi_info>);

// SAFETY: as for InfoList.
unsafe impl Send for Info {}

impl Info {
    /// A copy of `from`.
    pub(crate) fn dup(from: InfoRef<'_>) -> Result<Info> {
        // SAFETY: fi_dupinfo copies the live entry.
        let raw = unsafe { ffi::fi_dupinfo(from.as_ptr()) };
        NonNull::new(raw)
            .map(Info)
            .ok_or_else(|| Error::from_rc("fi_dupinfo", -(ffi::FI_ENOMEM as i64)))
    }

    /// Take ownership of an `fi_info` libfabric handed over to be freed.
    ///
    /// # Safety
    /// `raw` is such an `fi_info`, freed by nothing else.
    pub(crate) unsafe fn from_raw(raw: *mut ffi::fi_info) -> Option<Info> {
        NonNull::new(raw).map(Info)
    }

    pub(crate) fn as_ref(&self) -> InfoRef<'_> {
        InfoRef(self.0, PhantomData)
    }

    /// Set the destination address (`dest_addr`) to `addr`.
    pub(crate) fn set_dest_addr(&mut self, addr: &[u8]) -> Result<()> {
        // SAFETY: this value owns the info; dest_addr gets malloc'd memory
        // that fi_freeinfo frees with it, and the old one is freed once.
        unsafe {
            let dest = libc::malloc(addr.len().max(1));
            if dest.is_null() {
                return Err(Error::from_rc("malloc", -(ffi::FI_ENOMEM as i64)));
            }
            ptr::copy_nonoverlapping(addr.as_ptr(), dest.cast::<u8>(), addr.len());
            let i = self.0.as_mut();
            libc::free(i.dest_addr);
            i.dest_addr = dest;
            i.dest_addrlen = addr.len();
        }
        Ok(())
    }

    /// A connection request's handle (`fi_info::handle`), for `fi_reject`.
    pub(crate) fn handle(&self) -> *mut ffi::fid {
        self.as_ref().get().handle
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: owned, freed once; fi_freeinfo leaves `handle` alone.
        unsafe { ffi::fi_freeinfo(self.0.as_ptr()) }
    }
}

/// What to ask `fi_getinfo` for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hints {
    pub caps: u64,
    pub mode: u64,
    pub mr_mode: u64,
    /// `FI_EP_RDM`, `FI_EP_MSG`, ...; `None` for any.
    pub endpoint_type: Option<ffi::fi_ep_type>,
    pub provider: Option<String>,
    pub domain: Option<String>,
}

/// Call `fi_getinfo`. `Err(Error::NoData)` means nothing matched.
pub(crate) fn getinfo(h: &Hints) -> Result<InfoList> {
    // SAFETY: fi_allocinfo returns a zeroed fi_info with its attribute
    // structs allocated, or NULL.
    let hints = InfoList(unsafe { ffi::fi_allocinfo() });
    if hints.0.is_null() {
        return Err(Error::from_rc("fi_allocinfo", -(ffi::FI_ENOMEM as i64)));
    }
    let dup = |s: &str| -> Result<*mut std::os::raw::c_char> {
        let c = CString::new(s).map_err(|_| Error::Config {
            source_name: "hints".into(),
            message: format!("name {s:?} contains a NUL byte"),
        })?;
        // SAFETY: strdup copies a valid C string into malloc'd memory that
        // fi_freeinfo will free with the hints.
        Ok(unsafe { libc::strdup(c.as_ptr()) })
    };
    // SAFETY: hints.0 and its sub-structs are valid (allocated above); string
    // fields get malloc'd copies owned by the hints from here on.
    unsafe {
        let i = &mut *hints.0;
        i.caps = h.caps;
        i.mode = h.mode;
        (*i.domain_attr).mr_mode = h.mr_mode as i32;
        (*i.ep_attr).type_ = h.endpoint_type.unwrap_or(ffi::FI_EP_UNSPEC);
        if let Some(p) = &h.provider {
            (*i.fabric_attr).prov_name = dup(p)?;
        }
        if let Some(d) = &h.domain {
            (*i.domain_attr).name = dup(d)?;
        }
    }
    let mut out = ptr::null_mut();
    // SAFETY: hints is a valid fi_info; `out` receives a list owned by the
    // returned InfoList.
    let rc = unsafe { ffi::fi_getinfo(ffi::API_VERSION, ptr::null(), ptr::null(), 0, hints.0, &mut out) };
    check("fi_getinfo", rc)?;
    Ok(InfoList(out))
}
