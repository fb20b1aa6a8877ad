//! The u64 atomic operations fabric-msg offers, named without their
//! operands, and how each maps to libfabric's `fi_op` and call form. A
//! [`Profile`](crate::Profile) answers
//! [`supports`](crate::Profile::supports) for each, from what
//! `fi_*atomicvalid` accepted while negotiating.

use crate::ffi;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A u64 atomic operation, without its operands: what a [`Profile`] can be
/// asked about (`profile.supports(AtomicKind::FetchAdd)`).
///
/// [`Profile`]: crate::Profile
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AtomicKind {
    /// Add, returning nothing (`FI_SUM`).
    Add,
    /// Add, returning the old value (`FI_SUM`, fetching).
    FetchAdd,
    /// Store, returning the old value (`FI_ATOMIC_WRITE`, fetching).
    Swap,
    /// Compare and swap (`FI_CSWAP`).
    CompareSwap,
    /// Store the minimum, returning the old value (`FI_MIN`, fetching).
    FetchMin,
    /// Store the maximum, returning the old value (`FI_MAX`, fetching).
    FetchMax,
    /// Read atomically (`FI_ATOMIC_READ`, fetching).
    Read,
}

/// Which libfabric call carries an atomic: `fi_atomic`, `fi_fetch_atomic`
/// or `fi_compare_atomic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtomicForm {
    Plain,
    Fetch,
    Compare,
}

impl AtomicForm {
    /// The name [`AtomicSupport::form`](crate::discovery::probe::AtomicSupport::form) uses.
    pub(crate) fn name(self) -> &'static str {
        match self {
            AtomicForm::Plain => "atomic",
            AtomicForm::Fetch => "fetch",
            AtomicForm::Compare => "compare",
        }
    }
}

impl AtomicKind {
    /// Every operation, in declaration order.
    pub const ALL: [AtomicKind; 7] = [
        AtomicKind::Add,
        AtomicKind::FetchAdd,
        AtomicKind::Swap,
        AtomicKind::CompareSwap,
        AtomicKind::FetchMin,
        AtomicKind::FetchMax,
        AtomicKind::Read,
    ];

    /// libfabric's operation, its name, and the call form.
    pub(crate) fn libfabric(self) -> (ffi::fi_op, &'static str, AtomicForm) {
        use AtomicForm::{Compare, Fetch, Plain};
        match self {
            AtomicKind::Add => (ffi::FI_SUM, "FI_SUM", Plain),
            AtomicKind::FetchAdd => (ffi::FI_SUM, "FI_SUM", Fetch),
            AtomicKind::Swap => (ffi::FI_ATOMIC_WRITE, "FI_ATOMIC_WRITE", Fetch),
            AtomicKind::CompareSwap => (ffi::FI_CSWAP, "FI_CSWAP", Compare),
            AtomicKind::FetchMin => (ffi::FI_MIN, "FI_MIN", Fetch),
            AtomicKind::FetchMax => (ffi::FI_MAX, "FI_MAX", Fetch),
            AtomicKind::Read => (ffi::FI_ATOMIC_READ, "FI_ATOMIC_READ", Fetch),
        }
    }
}

/// How fabric-msg carries an atomic operation (see
/// [`Profile::atomic_carrier`](crate::Profile::atomic_carrier)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AtomicCarrier {
    /// The provider's own atomics (`fi_atomic` and friends): the target's
    /// NIC or provider applies them.
    Native,
    /// fabric-msg's emulation: a request message in a reserved tag space,
    /// applied by the target's event loop while it polls, answered by a
    /// reply that completes the operation.
    Emulated,
}

impl fmt::Display for AtomicCarrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AtomicCarrier::Native => "native",
            AtomicCarrier::Emulated => "emulated",
        })
    }
}

/// Which carrier the application wants for its atomics: both peers must
/// make the same choice (it is part of the [`WireProfile`](crate::discovery::profile::WireProfile)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum AtomicPolicy {
    /// Native when the provider validates every operation, emulated
    /// otherwise (the default).
    #[default]
    Auto,
    /// Only the provider's own atomics; operations it lacks are refused.
    /// Negotiating with this policy and `Capability::Atomic` chooses a
    /// provider with native atomics, as fabric-msg did before emulation.
    Native,
    /// Always emulated, even where the provider has atomics (to compare
    /// the two, or to share a region with peers that must emulate).
    Emulated,
}

impl AtomicKind {
    /// The operation's code in an emulated request (its index in [`ALL`](Self::ALL)).
    pub(crate) fn code(self) -> u8 {
        AtomicKind::ALL.iter().position(|&o| o == self).unwrap_or(0) as u8
    }

    /// The operation with this request code, if any.
    pub(crate) fn from_code(code: u8) -> Option<AtomicKind> {
        AtomicKind::ALL.get(code as usize).copied()
    }

    /// Whether the operation returns the old value.
    pub fn fetches(self) -> bool {
        self != AtomicKind::Add
    }
}

impl fmt::Display for AtomicKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (_, name, form) = self.libfabric();
        write!(f, "u64 {name} ({})", form.name())
    }
}
