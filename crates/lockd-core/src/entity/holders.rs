//! The holders of one name, compact: the usual single holder is stored inline in the lock's
//! record; only a shared or semaphore name with two or more holders allocates a `Vec`. It does
//! not change what is replicated: [`Holders`] serialises exactly as a `Vec<Holder>`.

use std::fmt;
use std::ops::{Deref, DerefMut};

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Holder;

/// The holders of one name: none, one inline, or two or more in a `Vec`.
///
/// Canonical: a `Vec` never holds exactly one holder, so equal contents compare equal.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Holders(Repr);

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    One(Holder),
    /// Zero, or two and more.
    Many(Vec<Holder>),
}

impl Default for Holders {
    fn default() -> Self {
        Holders(Repr::Many(Vec::new()))
    }
}

impl Holders {
    fn from_vec(mut v: Vec<Holder>) -> Holders {
        if v.len() == 1 {
            Holders(Repr::One(v.pop().expect("one element")))
        } else {
            Holders(Repr::Many(v))
        }
    }

    /// Back to the canonical form after a removal.
    fn normalize(&mut self) {
        if let Repr::Many(v) = &mut self.0 {
            if v.len() <= 1 {
                *self = Holders::from_vec(std::mem::take(v));
            }
        }
    }

    pub(crate) fn push(&mut self, h: Holder) {
        match &mut self.0 {
            Repr::Many(v) if v.is_empty() => self.0 = Repr::One(h),
            Repr::Many(v) => v.push(h),
            Repr::One(_) => {
                let Repr::One(first) = std::mem::take(self).0 else {
                    unreachable!("matched One")
                };
                self.0 = Repr::Many(vec![first, h]);
            }
        }
    }

    /// Removes and returns the holder at `i`, keeping the order of the others.
    pub(crate) fn remove(&mut self, i: usize) -> Holder {
        let h = match &mut self.0 {
            Repr::Many(v) => v.remove(i),
            Repr::One(_) => {
                assert_eq!(i, 0, "holder index out of range");
                let Repr::One(h) = std::mem::take(self).0 else {
                    unreachable!("matched One")
                };
                h
            }
        };
        self.normalize();
        h
    }

    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Holder) -> bool) {
        match &mut self.0 {
            Repr::Many(v) => v.retain(keep),
            Repr::One(h) => {
                if !keep(h) {
                    *self = Holders::default();
                }
            }
        }
        self.normalize();
    }
}

impl Deref for Holders {
    type Target = [Holder];
    fn deref(&self) -> &[Holder] {
        match &self.0 {
            Repr::One(h) => std::slice::from_ref(h),
            Repr::Many(v) => v,
        }
    }
}

impl DerefMut for Holders {
    fn deref_mut(&mut self) -> &mut [Holder] {
        match &mut self.0 {
            Repr::One(h) => std::slice::from_mut(h),
            Repr::Many(v) => v,
        }
    }
}

impl<'a> IntoIterator for &'a Holders {
    type Item = &'a Holder;
    type IntoIter = std::slice::Iter<'a, Holder>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl fmt::Debug for Holders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Holders {
    /// The same bytes as a `Vec<Holder>` (the snapshot format does not change).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Holders {
    /// Decodes a `Vec<Holder>`'s bytes straight into the inline form (restoring a million
    /// locks would otherwise allocate and free a million one-element `Vec`s).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Seq;
        impl<'de> Visitor<'de> for Seq {
            type Value = Holders;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of holders")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Holders, A::Error> {
                let Some(first) = seq.next_element::<Holder>()? else {
                    return Ok(Holders::default());
                };
                let Some(second) = seq.next_element::<Holder>()? else {
                    return Ok(Holders(Repr::One(first)));
                };
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024) + 2);
                v.push(first);
                v.push(second);
                while let Some(h) = seq.next_element::<Holder>()? {
                    v.push(h);
                }
                Ok(Holders(Repr::Many(v)))
            }
        }
        d.deserialize_seq(Seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entity::test_holder as holder;

    #[test]
    fn holders_behave_like_a_vec_and_serialise_as_one() {
        let mut h = Holders::default();
        let mut v: Vec<Holder> = Vec::new();
        let same = |h: &Holders, v: &Vec<Holder>| {
            assert_eq!(&**h, v.as_slice());
            assert_eq!(
                postcard::to_allocvec(h).unwrap(),
                postcard::to_allocvec(v).unwrap()
            );
            let back: Holders = postcard::from_bytes(&postcard::to_allocvec(v).unwrap()).unwrap();
            assert_eq!(&back, h, "decoded form is canonical");
            assert_eq!(matches!(h.0, Repr::One(_)), v.len() == 1);
        };
        same(&h, &v);
        for t in 1..=4 {
            h.push(holder(t));
            v.push(holder(t));
            same(&h, &v);
        }
        h[2].reentry += 1;
        v[2].reentry += 1;
        same(&h, &v);
        assert_eq!(h.remove(1), v.remove(1));
        same(&h, &v);
        h.retain(|x| x.token != 4);
        v.retain(|x| x.token != 4);
        same(&h, &v);
        assert_eq!(h.remove(0), v.remove(0));
        same(&h, &v);
        h.retain(|x| x.token == 3);
        v.retain(|x| x.token == 3);
        same(&h, &v);
        h.retain(|_| false);
        v.retain(|_| false);
        same(&h, &v);
        h.push(holder(9));
        v.push(holder(9));
        same(&h, &v);
        assert_eq!(h.remove(0), v.remove(0));
        same(&h, &v);
    }
}
