//! Values many holders share, each kept once: the answer EC2 gives every instance of one type
//! under one switch (but for its ID), the labels the cache keeps of every such node.
//!
//! Owns: the shared values and when unused ones go. Never decides what is shared.

use std::{collections::HashSet, hash::Hash, sync::Arc};

/// A set of shared values. Values no holder keeps any more go when the set has doubled since
/// the last sweep (and at least [`Interner::FLOOR`] apart): bounded by twice what is in use,
/// at a constant cost per value.
#[derive(Debug)]
pub struct Interner<T: ?Sized + Hash + Eq> {
    set: HashSet<Arc<T>>,
    /// How many values were in use at the last sweep.
    swept: usize,
}

impl<T: ?Sized + Hash + Eq> Default for Interner<T> {
    fn default() -> Self {
        Self {
            set: HashSet::new(),
            swept: 0,
        }
    }
}

impl<T: ?Sized + Hash + Eq> Interner<T> {
    /// Unused values are not swept before there are this many.
    pub const FLOOR: usize = 1024;

    /// The value equal to `value`, shared.
    pub fn share(&mut self, value: Arc<T>) -> Arc<T> {
        if let Some(shared) = self.set.get(&value) {
            return shared.clone();
        }
        if self.set.len() >= self.swept.saturating_mul(2).max(Self::FLOOR) {
            self.sweep();
        }
        self.set.insert(value.clone());
        value
    }

    /// The value equal to `value`, shared: a copy of it kept when none is. (Never another
    /// set's `Arc`: a value two sets held would be in use for both, and swept by neither.)
    pub fn share_copy(&mut self, value: &T) -> Arc<T>
    where
        T: Clone,
    {
        match self.set.get(value) {
            Some(shared) => shared.clone(),
            None => self.share(Arc::new(value.clone())),
        }
    }

    /// Drop the values no holder keeps.
    pub fn sweep(&mut self) {
        self.set.retain(|v| Arc::strong_count(v) > 1);
        self.swept = self.set.len();
    }

    /// How many values are kept (some may be held by nobody until the next sweep).
    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_are_one_and_unused_ones_go() {
        let mut i = Interner::<str>::default();
        let a = i.share(Arc::from("a"));
        let a2 = i.share(Arc::from("a"));
        assert!(Arc::ptr_eq(&a, &a2));
        let b = i.share(Arc::from("b"));
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(i.len(), 2);
        drop(b);
        i.sweep();
        assert_eq!(i.len(), 1, "b is held by nobody");
    }

    #[test]
    fn a_copy_is_shared_never_another_sets_value() {
        let mut mine = Interner::<String>::default();
        let theirs = Arc::new("a".to_owned());
        let a = mine.share_copy(&theirs);
        assert!(!Arc::ptr_eq(&a, &theirs), "kept as a copy of its own");
        assert!(Arc::ptr_eq(&a, &mine.share_copy(&"a".to_owned())));
        // The other set's value going does not keep ours, nor ours theirs.
        drop(theirs);
        drop(a);
        mine.sweep();
        assert_eq!(mine.len(), 0);
    }

    #[test]
    fn garbage_is_bounded_by_twice_what_is_in_use() {
        let mut i = Interner::<str>::default();
        let held: Vec<Arc<str>> = (0..10)
            .map(|k| i.share(Arc::from(format!("held-{k}"))))
            .collect();
        for k in 0..100_000 {
            // Each dropped at once: garbage, swept as the set grows.
            i.share(Arc::from(format!("passing-{k}")));
            assert!(i.len() <= 2 * (held.len() + 1).max(Interner::<str>::FLOOR));
        }
        i.sweep();
        assert_eq!(i.len(), held.len());
    }
}
