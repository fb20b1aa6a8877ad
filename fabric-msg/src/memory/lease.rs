//! The lease on a pool slot: the slot goes back to its pool's free list
//! when the last holder (the user's `PoolSlot` or an operation in flight)
//! lets go.

use parking_lot::Mutex;
use std::sync::Arc;

/// Returns a pool slot to its pool when the last holder (the user's
/// [`PoolSlot`] or an operation in flight) lets go.
pub(crate) struct Lease {
    pub(crate) index: u32,
    pub(crate) free: Arc<Mutex<Vec<u32>>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.free.lock().push(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_slots_come_back_when_released() {
        let free = Arc::new(Mutex::new(vec![1, 0]));
        {
            let _a = Lease {
                index: free.lock().pop().unwrap(),
                free: free.clone(),
            };
            assert_eq!(free.lock().len(), 1);
        }
        assert_eq!(free.lock().len(), 2);
    }
}
