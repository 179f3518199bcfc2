//! Laying options out in a reply: in the client's order of priority, within its size limit,
//! long values split into parts of at most 255 bytes (RFC 3396), and, when the options field
//! is full, continued in the header's `file` and `sname` fields (option overload, RFC 2131
//! §4.1, RFC 2132 §9.3) if no boot file or server name occupies them.
//!
//! A split option's parts are placed in the order RFC 3396 §5 concatenates them: the options
//! field first, then `file`, then `sname`.

/// Size of the header's `file` and `sname` fields.
pub const FILE_LEN: usize = 128;
pub const SNAME_LEN: usize = 64;

/// Option 52's value for the fields it names.
const OVERLOAD_FILE: u8 = 1;
const OVERLOAD_SNAME: u8 = 2;

/// Where the options went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// Options for the options field (without End), option 52 included when used.
    pub main: Vec<u8>,
    /// The `file` field's content when overloaded (options, End, padding).
    pub file: Option<[u8; FILE_LEN]>,
    /// The `sname` field's content when overloaded.
    pub sname: Option<[u8; SNAME_LEN]>,
    /// Which items (by index) made it into the reply.
    pub placed: Vec<bool>,
}

/// Appends option `code` with `data` split into parts of at most 255 bytes.
pub fn put(out: &mut Vec<u8>, code: u8, data: &[u8]) {
    if data.is_empty() {
        out.extend_from_slice(&[code, 0]);
        return;
    }
    for part in data.chunks(255) {
        out.push(code);
        out.push(part.len() as u8);
        out.extend_from_slice(part);
    }
}

/// At most three areas: the options field, `file`, `sname`.
const AREAS: usize = 3;

/// The parts an option is split into: at most 255 bytes each, and one empty part for an
/// empty value.
fn parts(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let empty: &[u8] = &[];
    data.chunks(255).chain(data.is_empty().then_some(empty))
}

/// Places `items` (code, data) in order into areas of the given room, each part in the first
/// area at or after the previous part's that has room; an item whose parts do not all fit is
/// left out whole. Returns each area's bytes and which items were placed. Nothing is allocated
/// per item: a reply is built for every request.
fn place(items: &[(u8, &[u8])], room: &[usize]) -> (Vec<Vec<u8>>, Vec<bool>) {
    let n = room.len().min(AREAS);
    let mut left = [0usize; AREAS];
    left[..n].copy_from_slice(&room[..n]);
    let mut areas: Vec<Vec<u8>> = room[..n].iter().map(|r| Vec::with_capacity(*r)).collect();
    let mut placed = Vec::with_capacity(items.len());
    for (code, data) in items {
        // First pass: where each part goes, on a copy of the room left.
        let mut trial = left;
        let mut area = 0;
        let mut fits = true;
        for part in parts(data) {
            let need = 2 + part.len();
            while area < n && trial[area] < need {
                area += 1;
            }
            if area == n {
                fits = false;
                break;
            }
            trial[area] -= need;
        }
        if fits {
            // Second pass: the same walk, writing.
            let mut area = 0;
            for part in parts(data) {
                let need = 2 + part.len();
                while left[area] < need {
                    area += 1;
                }
                left[area] -= need;
                areas[area].push(*code);
                areas[area].push(part.len() as u8);
                areas[area].extend_from_slice(part);
            }
        }
        placed.push(fits);
    }
    (areas, placed)
}

/// Lays out `items` (highest priority first) in `main_room` bytes of the options field (what
/// is left after the fixed options, the relay's option 82 and End), overloading `file`
/// and/or `sname` when they are free and that gets more of the items in without losing any.
pub fn pack(items: &[(u8, &[u8])], main_room: usize, file_free: bool, sname_free: bool) -> Packed {
    let (mut areas, placed) = place(items, &[main_room]);
    let all_in = placed.iter().all(|p| *p);
    if all_in || !(file_free || sname_free) || main_room < 3 {
        return Packed { main: areas.swap_remove(0), file: None, sname: None, placed };
    }
    // Option 52 itself takes 3 bytes of the options field; each overloaded field keeps a byte
    // for its End option.
    let room = [main_room - 3, if file_free { FILE_LEN - 1 } else { 0 }, if sname_free { SNAME_LEN - 1 } else { 0 }];
    let (over, over_placed) = place(items, &room);
    let superset = placed.iter().zip(&over_placed).all(|(a, b)| !a || *b);
    let more = over_placed.iter().filter(|p| **p).count() > placed.iter().filter(|p| **p).count();
    if !(superset && more) {
        return Packed { main: areas.swap_remove(0), file: None, sname: None, placed };
    }
    let mut flags = 0;
    let field = |bytes: &[u8], len: usize| -> Option<Vec<u8>> {
        (!bytes.is_empty()).then(|| {
            let mut f = bytes.to_vec();
            f.push(255);
            f.resize(len, 0);
            f
        })
    };
    let file = field(&over[1], FILE_LEN).map(|f| {
        flags |= OVERLOAD_FILE;
        <[u8; FILE_LEN]>::try_from(f.as_slice()).expect("file field length")
    });
    let sname = field(&over[2], SNAME_LEN).map(|f| {
        flags |= OVERLOAD_SNAME;
        <[u8; SNAME_LEN]>::try_from(f.as_slice()).expect("sname field length")
    });
    if flags == 0 {
        return Packed { main: areas.swap_remove(0), file: None, sname: None, placed };
    }
    let mut main = Vec::with_capacity(3 + over[0].len());
    main.extend_from_slice(&[52, 1, flags]);
    main.extend_from_slice(&over[0]);
    Packed { main, file, sname, placed: over_placed }
}
