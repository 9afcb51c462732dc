//! A batch's Arrow deliveries column, written by the kernel ([`Kernel::layout`]).

use crate::kernel::Kernel;
use crate::trie::prefetch;

/// A batch's units grouped by subscriber, and what each takes in the output
/// (see [`Kernel::layout`]).
pub(crate) struct LayoutPlan {
    /// Per group, its positions `first..end` in `flat` and its subscriber;
    /// unit `u`'s groups are `groups[unit_groups[u]..unit_groups[u + 1]]`.
    pub(crate) groups: Vec<(u32, u32, u32)>,
    pub(crate) unit_groups: Vec<u32>,
    pub(crate) units: Vec<UnitSize>,
    /// The ids of `flat`, in its order: slot `flat[i]`'s id is
    /// `staged[staged_end[i - 1]..staged_end[i]]` (gathered once, with the
    /// next slots' table entries and ids prefetched, so that the rows are
    /// written from sequential memory).
    pub(crate) staged: Vec<u8>,
    pub(crate) staged_end: Vec<u32>,
}

#[derive(Clone, Copy)]
pub(crate) struct UnitSize {
    pub(crate) groups: u64,
    pub(crate) ids: u64,
    pub(crate) id_bytes: u64,
    pub(crate) name_bytes: u64,
}

impl LayoutPlan {
    /// The byte sizes of the six buffers for rows `row_unit`, or why they
    /// cannot be one Arrow column (32-bit offsets).
    pub(crate) fn sizes(&self, row_unit: &[u32]) -> Result<[usize; 6], String> {
        let mut total = UnitSize {
            groups: 0,
            ids: 0,
            id_bytes: 0,
            name_bytes: 0,
        };
        for &u in row_unit {
            let size = self.units[u as usize];
            total.groups += size.groups;
            total.ids += size.ids;
            total.id_bytes += size.id_bytes;
            total.name_bytes += size.name_bytes;
        }
        if [total.groups, total.ids, total.id_bytes, total.name_bytes]
            .iter()
            .any(|&n| n > i32::MAX as u64)
        {
            return Err(format!(
                "a batch's deliveries column would exceed Arrow's 32-bit offsets ({} deliveries, {} ids, {} bytes of ids): \
                 use smaller batches",
                total.groups, total.ids, total.id_bytes
            ));
        }
        let offsets = |n: u64| 4 * (n as usize + 1);
        Ok([
            offsets(row_unit.len() as u64),
            offsets(total.groups),
            offsets(total.ids),
            total.id_bytes as usize,
            offsets(total.groups),
            total.name_bytes as usize,
        ])
    }
}

impl Kernel {
    /// Each unit's deliveries, grouped by subscriber once, and every id of
    /// `flat` gathered (see [`LayoutPlan`] and [`Kernel::layout`]).
    pub(crate) fn plan_layout(&self, flat: &[u32], offsets: &[u32]) -> LayoutPlan {
        const AHEAD: usize = 16;
        let n_units = offsets.len() - 1;
        let mut plan = LayoutPlan {
            groups: Vec::new(),
            unit_groups: vec![0; n_units + 1],
            units: Vec::with_capacity(n_units),
            staged: Vec::new(),
            staged_end: Vec::with_capacity(flat.len()),
        };
        let mut subscribers: Vec<u32> = Vec::with_capacity(flat.len());
        for i in 0..flat.len() {
            if let Some(&ahead) = flat.get(i + AHEAD) {
                prefetch(&self.slots[ahead as usize]);
            }
            if let Some(&near) = flat.get(i + AHEAD / 2) {
                prefetch(self.id_data[self.slots[near as usize].id_start as usize..].as_ptr());
            }
            let info = self.slots[flat[i] as usize];
            plan.staged
                .extend_from_slice(&self.id_data[info.id_start as usize..][..info.id_len as usize]);
            plan.staged_end.push(plan.staged.len() as u32);
            subscribers.push(info.subscriber);
        }
        for u in 0..n_units {
            let (start, end) = (offsets[u] as usize, offsets[u + 1] as usize);
            let mut name_bytes = 0u64;
            let mut first = start;
            for i in start + 1..=end {
                if i == end || subscribers[i] != subscribers[first] {
                    let subscriber = subscribers[first] as usize;
                    name_bytes +=
                        (self.name_offsets[subscriber + 1] - self.name_offsets[subscriber]) as u64;
                    plan.groups
                        .push((first as u32, i as u32, subscribers[first]));
                    first = i;
                }
            }
            plan.unit_groups[u + 1] = plan.groups.len() as u32;
            let staged_at = |i: usize| {
                if i == 0 {
                    0
                } else {
                    plan.staged_end[i - 1] as u64
                }
            };
            plan.units.push(UnitSize {
                groups: (plan.unit_groups[u + 1] - plan.unit_groups[u]) as u64,
                ids: (end - start) as u64,
                id_bytes: staged_at(end) - staged_at(start),
                name_bytes,
            });
        }
        plan
    }

    /// Writes the six buffers of [`Kernel::layout`], sized by [`LayoutPlan::sizes`].
    /// A unit is written from the tables once; a later row of the same unit
    /// copies that first copy (sequential reads instead of a memory miss per
    /// id: rows of one topic repeat in a batch).
    pub(crate) fn write_layout(&self, plan: &LayoutPlan, row_unit: &[u32], out: &mut [&mut [u8]]) {
        let [row_offsets, group_offsets, id_offsets, id_data, name_offsets, name_data] = out else {
            unreachable!("six buffers")
        };
        let get = |buffer: &[u8], k: usize| {
            i32::from_ne_bytes(buffer[4 * k..4 * k + 4].try_into().unwrap()) as usize
        };
        let put = |buffer: &mut [u8], k: usize, value: usize| {
            buffer[4 * k..4 * k + 4].copy_from_slice(&(value as i32).to_ne_bytes())
        };
        // Where each unit's first copy starts: (group index, id index); the
        // byte positions follow from the offsets already written.
        let mut written: Vec<Option<(usize, usize)>> = vec![None; plan.units.len()];
        let (mut groups, mut ids) = (0usize, 0usize);
        for buffer in [
            &mut **row_offsets,
            &mut **group_offsets,
            &mut **id_offsets,
            &mut **name_offsets,
        ] {
            put(buffer, 0, 0);
        }
        for (r, &u) in row_unit.iter().enumerate() {
            let size = plan.units[u as usize];
            let (n_groups, n_ids) = (size.groups as usize, size.ids as usize);
            if let Some((first_group, first_id)) = written[u as usize] {
                let (id_from, id_to) = (get(id_offsets, first_id), get(id_offsets, ids));
                let (name_from, name_to) =
                    (get(name_offsets, first_group), get(name_offsets, groups));
                id_data.copy_within(id_from..id_from + size.id_bytes as usize, id_to);
                name_data.copy_within(name_from..name_from + size.name_bytes as usize, name_to);
                for k in 1..=n_ids {
                    let v = get(id_offsets, first_id + k) - id_from + id_to;
                    put(id_offsets, ids + k, v);
                }
                for k in 1..=n_groups {
                    let g = get(group_offsets, first_group + k) - first_id + ids;
                    put(group_offsets, groups + k, g);
                    let v = get(name_offsets, first_group + k) - name_from + name_to;
                    put(name_offsets, groups + k, v);
                }
            } else {
                written[u as usize] = Some((groups, ids));
                let (mut id_end, mut name_end) = (get(id_offsets, ids), get(name_offsets, groups));
                let mut k_ids = ids;
                for (g, &(first, end, subscriber)) in plan.groups[plan.unit_groups[u as usize]
                    as usize
                    ..plan.unit_groups[u as usize + 1] as usize]
                    .iter()
                    .enumerate()
                {
                    let subscriber = subscriber as usize;
                    let name = &self.name_data[self.name_offsets[subscriber] as usize
                        ..self.name_offsets[subscriber + 1] as usize];
                    name_data[name_end..name_end + name.len()].copy_from_slice(name);
                    name_end += name.len();
                    let from = if first == 0 {
                        0
                    } else {
                        plan.staged_end[first as usize - 1] as usize
                    };
                    let to = plan.staged_end[end as usize - 1] as usize;
                    id_data[id_end..id_end + (to - from)].copy_from_slice(&plan.staged[from..to]);
                    for i in first as usize..end as usize {
                        k_ids += 1;
                        put(
                            id_offsets,
                            k_ids,
                            id_end + plan.staged_end[i] as usize - from,
                        );
                    }
                    id_end += to - from;
                    put(group_offsets, groups + g + 1, k_ids);
                    put(name_offsets, groups + g + 1, name_end);
                }
            }
            groups += n_groups;
            ids += n_ids;
            put(row_offsets, r + 1, groups);
        }
    }
}
