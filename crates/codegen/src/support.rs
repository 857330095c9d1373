//! The support module emitted once into every generated package
//! (`<package>::_protoplane`): typed repeated and map views and the small
//! helpers the generated accessors call.
//!
//! It is generated rather than shipped in a runtime crate so that generated
//! code depends on nothing but `protoplane-schema` and `protoplane-wire`;
//! each package gets its own copy (a few hundred lines), and a package
//! implements its [`Elem`] trait for every foreign view type it stores in a
//! repeated or map field.

/// The module's source, at indentation level 0.
pub(crate) const SUPPORT: &str = r#"/// Runtime support of this package's views and builders (generated once per
/// package): typed repeated and map views, and the helpers the generated
/// accessors call.
///
/// Reads never fail and never panic: a reference in a block that does not
/// resolve (out of range, device-placed, cyclic garbage from another
/// process) reads as absent (a singular message), empty (a string, bytes or
/// repeated field) or as the empty message (an element of a repeated message
/// field or a map value), and a map entry that cannot be read is skipped.
pub mod _protoplane {
    use ::protoplane_wire::MessageView;
    use ::std::borrow::Borrow;
    use ::std::fmt;
    use ::std::marker::PhantomData;

    pub use ::protoplane_schema::{Card, FieldOp, TableSet, ValueOp};

    /// An element type of [`Repeated`] and a key or value type of [`Map`]:
    /// read from the bytes it occupies in an array or a map entry's slot.
    pub trait Elem<'a>: Sized + Copy {
        /// Bytes per element: the slot size of a scalar, 8 for a reference.
        const STRIDE: usize;
        /// Reads one element from its `STRIDE` bytes (`None`: unreadable).
        fn read(view: &MessageView<'a>, bytes: &'a [u8]) -> Option<Self>;
    }

    macro_rules! le_elem {
        ($($t:ty),*) => {$(
            impl<'a> Elem<'a> for $t {
                const STRIDE: usize = ::std::mem::size_of::<$t>();
                #[inline(always)]
                fn read(_: &MessageView<'a>, bytes: &'a [u8]) -> Option<Self> {
                    Some(<$t>::from_le_bytes(bytes.try_into().ok()?))
                }
            }
        )*};
    }
    le_elem!(i32, u32, i64, u64, f32, f64);

    impl<'a> Elem<'a> for bool {
        const STRIDE: usize = 1;
        #[inline(always)]
        fn read(_: &MessageView<'a>, bytes: &'a [u8]) -> Option<Self> {
            Some(*bytes.first()? != 0)
        }
    }

    impl<'a> Elem<'a> for &'a [u8] {
        const STRIDE: usize = 8;
        #[inline(always)]
        fn read(view: &MessageView<'a>, bytes: &'a [u8]) -> Option<Self> {
            Some(view.ref_bytes(raw(bytes)?).unwrap_or(&[]))
        }
    }

    /// A string that is not valid UTF-8 (possible for proto2 `string`
    /// fields, or in a forged block) reads as empty.
    impl<'a> Elem<'a> for &'a str {
        const STRIDE: usize = 8;
        #[inline(always)]
        fn read(view: &MessageView<'a>, bytes: &'a [u8]) -> Option<Self> {
            let data = view.ref_bytes(raw(bytes)?).unwrap_or(&[]);
            Some(::std::str::from_utf8(data).unwrap_or(""))
        }
    }

    #[inline(always)]
    fn raw(bytes: &[u8]) -> Option<u64> {
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }

    /// A typed view of a repeated field: `len`, `get`, `iter`, `for` loops.
    pub struct Repeated<'a, T> {
        view: MessageView<'a>,
        arr: &'a [u8],
        elem: PhantomData<fn() -> T>,
    }

    impl<T> Clone for Repeated<'_, T> {
        fn clone(&self) -> Self {
            *self
        }
    }

    impl<T> Copy for Repeated<'_, T> {}

    impl<'a, T: Elem<'a>> Repeated<'a, T> {
        /// The repeated field whose reference slot is at `offset` in `view`.
        #[inline(always)]
        pub fn new(view: MessageView<'a>, offset: u32) -> Self {
            let arr = view.ref_array(view.slot_u64(offset), T::STRIDE).unwrap_or(&[]);
            Repeated { view, arr, elem: PhantomData }
        }

        /// Number of elements.
        #[inline(always)]
        pub fn len(&self) -> usize {
            self.arr.len() / T::STRIDE
        }

        /// No elements.
        #[inline(always)]
        pub fn is_empty(&self) -> bool {
            self.arr.is_empty()
        }

        /// Element `i` (`None` past the end).
        #[inline(always)]
        pub fn get(&self, i: usize) -> Option<T> {
            let start = i.checked_mul(T::STRIDE)?;
            T::read(&self.view, self.arr.get(start..start + T::STRIDE)?)
        }

        /// The first element.
        #[inline]
        pub fn first(&self) -> Option<T> {
            self.get(0)
        }

        /// The last element.
        #[inline]
        pub fn last(&self) -> Option<T> {
            self.get(self.len().checked_sub(1)?)
        }

        /// Iterates over the elements.
        #[inline]
        pub fn iter(&self) -> RepeatedIter<'a, T> {
            RepeatedIter { list: *self, next: 0, end: self.len() }
        }

        /// Copies the elements into a `Vec`.
        pub fn to_vec(&self) -> Vec<T> {
            self.iter().collect()
        }
    }

    impl<'a, T: Elem<'a> + fmt::Debug> fmt::Debug for Repeated<'a, T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_list().entries(self.iter()).finish()
        }
    }

    impl<'a, T: Elem<'a>> IntoIterator for Repeated<'a, T> {
        type Item = T;
        type IntoIter = RepeatedIter<'a, T>;
        fn into_iter(self) -> RepeatedIter<'a, T> {
            self.iter()
        }
    }

    /// Iterator over a [`Repeated`].
    pub struct RepeatedIter<'a, T> {
        list: Repeated<'a, T>,
        next: usize,
        end: usize,
    }

    impl<'a, T: Elem<'a> + fmt::Debug> fmt::Debug for RepeatedIter<'a, T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("RepeatedIter")
                .field("next", &self.next)
                .field("end", &self.end)
                .finish()
        }
    }

    impl<'a, T: Elem<'a>> Iterator for RepeatedIter<'a, T> {
        type Item = T;
        #[inline]
        fn next(&mut self) -> Option<T> {
            while self.next < self.end {
                self.next += 1;
                if let Some(v) = self.list.get(self.next - 1) {
                    return Some(v);
                }
            }
            None
        }
        fn size_hint(&self) -> (usize, Option<usize>) {
            (0, Some(self.end - self.next))
        }
    }

    impl<'a, T: Elem<'a>> DoubleEndedIterator for RepeatedIter<'a, T> {
        #[inline]
        fn next_back(&mut self) -> Option<T> {
            while self.end > self.next {
                self.end -= 1;
                if let Some(v) = self.list.get(self.end) {
                    return Some(v);
                }
            }
            None
        }
    }

    /// A typed view of a `map<K, V>` field: its entries in block order.
    /// A key that occurs twice (possible on the wire) is listed twice;
    /// [`Map::get`] returns the last value, as protobuf's decoders keep.
    pub struct Map<'a, K, V> {
        view: MessageView<'a>,
        arr: &'a [u8],
        entry: u32,
        key: u32,
        value: u32,
        kv: PhantomData<fn() -> (K, V)>,
    }

    impl<K, V> Clone for Map<'_, K, V> {
        fn clone(&self) -> Self {
            *self
        }
    }

    impl<K, V> Copy for Map<'_, K, V> {}

    impl<'a, K: Elem<'a>, V: Elem<'a>> Map<'a, K, V> {
        /// The map field whose reference slot is at `offset` in `view`; its
        /// entries are of type `entry` with the key slot at `key` and the
        /// value slot at `value`.
        #[inline(always)]
        pub fn new(view: MessageView<'a>, offset: u32, entry: u32, key: u32, value: u32) -> Self {
            let arr = view.ref_array(view.slot_u64(offset), 8).unwrap_or(&[]);
            Map { view, arr, entry, key, value, kv: PhantomData }
        }

        /// Number of entries (a repeated key counts each time).
        #[inline(always)]
        pub fn len(&self) -> usize {
            self.arr.len() / 8
        }

        /// No entries.
        #[inline(always)]
        pub fn is_empty(&self) -> bool {
            self.arr.is_empty()
        }

        /// Entry `i` in block order.
        #[inline]
        pub fn entry(&self, i: usize) -> Option<(K, V)> {
            let start = i.checked_mul(8)?;
            let raw = raw(self.arr.get(start..start + 8)?)?;
            let e = self.view.ref_message(raw, self.entry).ok()?;
            let k = K::read(&e, e.slot_bytes(self.key, K::STRIDE))?;
            let v = V::read(&e, e.slot_bytes(self.value, V::STRIDE))?;
            Some((k, v))
        }

        /// The value of `key` (the last one if the key occurs twice); a scan
        /// from the back, linear in the number of entries.
        pub fn get<Q>(&self, key: &Q) -> Option<V>
        where
            K: Borrow<Q>,
            Q: PartialEq + ?Sized,
        {
            self.iter().rev().find(|(k, _)| k.borrow() == key).map(|(_, v)| v)
        }

        /// Whether `key` is present.
        pub fn contains_key<Q>(&self, key: &Q) -> bool
        where
            K: Borrow<Q>,
            Q: PartialEq + ?Sized,
        {
            self.get(key).is_some()
        }

        /// Iterates over `(key, value)` in block order.
        #[inline]
        pub fn iter(&self) -> MapIter<'a, K, V> {
            MapIter { map: *self, next: 0, end: self.len() }
        }
    }

    impl<'a, K: Elem<'a> + fmt::Debug, V: Elem<'a> + fmt::Debug> fmt::Debug for Map<'a, K, V> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_map().entries(self.iter()).finish()
        }
    }

    impl<'a, K: Elem<'a>, V: Elem<'a>> IntoIterator for Map<'a, K, V> {
        type Item = (K, V);
        type IntoIter = MapIter<'a, K, V>;
        fn into_iter(self) -> MapIter<'a, K, V> {
            self.iter()
        }
    }

    /// Iterator over a [`Map`].
    pub struct MapIter<'a, K, V> {
        map: Map<'a, K, V>,
        next: usize,
        end: usize,
    }

    impl<'a, K: Elem<'a>, V: Elem<'a>> fmt::Debug for MapIter<'a, K, V> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("MapIter").field("next", &self.next).field("end", &self.end).finish()
        }
    }

    impl<'a, K: Elem<'a>, V: Elem<'a>> Iterator for MapIter<'a, K, V> {
        type Item = (K, V);
        #[inline]
        fn next(&mut self) -> Option<(K, V)> {
            while self.next < self.end {
                self.next += 1;
                if let Some(kv) = self.map.entry(self.next - 1) {
                    return Some(kv);
                }
            }
            None
        }
        fn size_hint(&self) -> (usize, Option<usize>) {
            (0, Some(self.end - self.next))
        }
    }

    impl<'a, K: Elem<'a>, V: Elem<'a>> DoubleEndedIterator for MapIter<'a, K, V> {
        #[inline]
        fn next_back(&mut self) -> Option<(K, V)> {
            while self.end > self.next {
                self.end -= 1;
                if let Some(kv) = self.map.entry(self.end) {
                    return Some(kv);
                }
            }
            None
        }
    }

    /// The `string` in the reference slot at `offset` (empty if the
    /// reference does not resolve or the bytes are not UTF-8).
    #[inline(always)]
    pub fn str_at<'a>(view: &MessageView<'a>, offset: u32) -> &'a str {
        ::std::str::from_utf8(bytes_at(view, offset)).unwrap_or("")
    }

    /// The `bytes` in the reference slot at `offset` (empty if the
    /// reference does not resolve).
    #[inline(always)]
    pub fn bytes_at<'a>(view: &MessageView<'a>, offset: u32) -> &'a [u8] {
        view.ref_bytes(view.slot_u64(offset)).unwrap_or(&[])
    }

    /// The reference in the slot at `offset` when its device flag is set
    /// (a `string` / `bytes` field a target-aware decode placed in the
    /// device region, RPCAcc's placement), `None` otherwise. The bytes are
    /// not in the block: the reference is a handle into the device region.
    #[inline(always)]
    pub fn device_ref_at(view: &MessageView<'_>, offset: u32) -> Option<::protoplane_wire::Ref> {
        view.device_ref_at(offset)
    }

    /// The sub-message of type `type_index` in the reference slot at
    /// `offset` (`None`: null, or a reference that does not resolve).
    #[inline(always)]
    pub fn message_at<'a>(
        view: &MessageView<'a>,
        offset: u32,
        type_index: u32,
    ) -> Option<MessageView<'a>> {
        let raw = view.slot_u64(offset);
        if raw as u32 == 0 {
            return None;
        }
        view.ref_message(raw, type_index).ok()
    }

    /// A message element (a reference's eight bytes): a reference that does
    /// not resolve reads as the empty message.
    #[inline(always)]
    pub fn element<'a>(
        view: &MessageView<'a>,
        bytes: &'a [u8],
        type_index: u32,
    ) -> Option<MessageView<'a>> {
        let raw = raw(bytes)?;
        view.ref_message(raw, type_index).or_else(|_| view.ref_message(0, type_index)).ok()
    }

    /// Whether `view` is a `type_index` object laid out as the generated code
    /// expects (same type, same object size).
    #[inline(always)]
    pub fn fits_view(view: &MessageView<'_>, type_index: u32, size: u32) -> bool {
        view.type_index() == type_index && fits(view.tables(), type_index, size)
    }

    /// Whether `type_index` has object size `size` in `ts`.
    #[inline(always)]
    pub fn fits(ts: &TableSet, type_index: u32, size: u32) -> bool {
        ts.messages().get(type_index as usize).is_some_and(|m| m.size == size)
    }

    /// Whether message `type_index` of `ts` is `name` with exactly this
    /// object size and these field ops (see `layout_matches`).
    pub fn same_layout(
        ts: &TableSet,
        type_index: u32,
        name: &str,
        size: u32,
        ops: &[FieldOp],
    ) -> bool {
        ts.messages().get(type_index as usize).is_some_and(|m| {
            m.size == size && ts.message_name(type_index) == name && ts.ops(m) == ops
        })
    }

    /// A field op, spelled positionally (the generated `FIELD_OPS` tables).
    #[allow(clippy::too_many_arguments)] // one argument per field of the struct
    pub const fn op(
        tag_bytes: u64,
        tag: u32,
        offset: u32,
        presence: u32,
        tag_len: u8,
        value: ValueOp,
        card: Card,
        size: u8,
    ) -> FieldOp {
        FieldOp { tag_bytes, tag, offset, presence, tag_len, value, card, size }
    }
}
"#;
