//! Avro binary straight to JSON text, walking the writer's schema over the payload's bytes.
//!
//! Written by hand because the crates' way (apache-avro decodes into its generic value, which
//! is then converted to `serde_json`'s, which is then written out) built two trees and sorted
//! every record's keys per record: 3.9× the host's CPU of a raw record at 100 bytes (a profile:
//! a fifth of it in malloc and free). This writes the same JSON (every type mapped as
//! apache-avro's conversion maps it: a union as its branch's value, an enum as its symbol,
//! bytes and fixed as arrays of numbers, logical dates and times as their numbers; keys in the
//! schema's order rather than sorted) from one pass and one output buffer.
//!
//! It takes only the schemas it can write exactly ([`writable`]): one with a named reference,
//! a decimal, a duration or a UUID (apache-avro checks a UUID string and writes it again,
//! hyphenated, in lower case) goes through apache-avro, as does a record whose map repeats a
//! key (a JSON object keeps one). Everything a payload claims is
//! checked before it is used: lengths against the bytes left, counts by the output they make
//! (at most [`MAX_OUTPUT`] bytes), varints at 10 bytes, strings as UTF-8, enum and union
//! indexes against the schema, floats finite (JSON has no NaN). A payload that ends before its
//! value does is refused: apache-avro 0.22 reads a string cut short, and a union whose index is
//! missing, as null, which would hand the plugin a garbled record as a valid one.

use apache_avro::Schema;

/// The most JSON one value may become: what apache-avro may allocate for one (a hostile
/// payload claiming a billion empty items is stopped here).
pub const MAX_OUTPUT: usize = super::MAX_AVRO_ALLOCATION;
/// The deepest nesting written (a schema deeper than this goes through apache-avro).
const MAX_DEPTH: usize = 64;
/// The reasons of a payload that ends before its value does.
const ENDS_EARLY: &str = "the payload ends inside a number";
const LEFT: &str = "are left";

/// Why a payload was not written.
#[derive(Debug, PartialEq)]
pub enum Unwritten {
    /// The payload does not decode with the schema: the record's reason.
    Invalid(String),
    /// It decodes, but only apache-avro's conversion says how (a map that repeats a key).
    Fallback,
}

/// Whether [`to_json`] writes every value of `schema` exactly as apache-avro's conversion does.
pub fn writable(schema: &Schema) -> bool {
    fn walk(s: &Schema, depth: usize) -> bool {
        if depth > MAX_DEPTH {
            return false;
        }
        match s {
            Schema::Null
            | Schema::Boolean
            | Schema::Int
            | Schema::Long
            | Schema::Float
            | Schema::Double
            | Schema::Bytes
            | Schema::String
            | Schema::Fixed(_)
            | Schema::Enum(_)
            | Schema::Date
            | Schema::TimeMillis
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => true,
            Schema::Array(a) => walk(&a.items, depth + 1),
            Schema::Map(m) => walk(&m.types, depth + 1),
            Schema::Union(u) => u.variants().iter().all(|v| walk(v, depth + 1)),
            Schema::Record(r) => r.fields.iter().all(|f| walk(&f.schema, depth + 1)),
            Schema::Decimal(_)
            | Schema::BigDecimal
            | Schema::Uuid(_)
            | Schema::Duration(_)
            | Schema::Ref { .. } => false,
        }
    }
    walk(schema, 0)
}

/// The JSON of the Avro `payload` written with `schema` (which [`writable`] accepted); the
/// whole payload must be the one value.
pub fn to_json(schema: &Schema, payload: &[u8]) -> Result<Vec<u8>, Unwritten> {
    let mut w = Writer {
        input: payload,
        out: Vec::with_capacity(payload.len() * 2 + 16),
    };
    w.value(schema)?;
    if !w.input.is_empty() {
        return Err(Unwritten::Invalid(format!(
            "{} bytes left after the Avro value",
            w.input.len()
        )));
    }
    Ok(w.out)
}

struct Writer<'a> {
    input: &'a [u8],
    out: Vec<u8>,
}

fn invalid(why: impl Into<String>) -> Unwritten {
    Unwritten::Invalid(why.into())
}

impl<'a> Writer<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Unwritten> {
        if n > self.input.len() {
            return Err(invalid(format!(
                "{what} of {n} bytes, but {} {LEFT}",
                self.input.len()
            )));
        }
        let (head, rest) = self.input.split_at(n);
        self.input = rest;
        Ok(head)
    }

    /// A zigzag varint of at most 10 bytes.
    fn long(&mut self) -> Result<i64, Unwritten> {
        let mut z = 0u64;
        for i in 0..10 {
            let [b, rest @ ..] = self.input else {
                return Err(invalid(ENDS_EARLY));
            };
            self.input = rest;
            z |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(if z & 1 == 0 {
                    (z >> 1) as i64
                } else {
                    !(z >> 1) as i64
                });
            }
        }
        Err(invalid("a number longer than 10 bytes"))
    }

    fn int(&mut self) -> Result<i32, Unwritten> {
        let n = self.long()?;
        i32::try_from(n).map_err(|_| invalid(format!("{n} is not an int")))
    }

    fn len(&mut self, what: &str) -> Result<usize, Unwritten> {
        let n = self.long()?;
        usize::try_from(n).map_err(|_| invalid(format!("{what} of negative length {n}")))
    }

    /// The count of the next block of an array or map (0 at its end); a negative count is
    /// followed by the block's size in bytes, which is read and not needed.
    fn block(&mut self) -> Result<u64, Unwritten> {
        let n = self.long()?;
        if n < 0 {
            self.long()?;
        }
        Ok(n.unsigned_abs())
    }

    fn room(&self) -> Result<(), Unwritten> {
        if self.out.len() > MAX_OUTPUT {
            return Err(invalid(format!(
                "the value is more than {} MiB as JSON",
                MAX_OUTPUT >> 20
            )));
        }
        Ok(())
    }

    fn number(&mut self, n: impl itoa::Integer) {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }

    fn float(&mut self, x: f64) -> Result<(), Unwritten> {
        if !x.is_finite() {
            return Err(invalid(format!("{x} has no JSON form")));
        }
        // serde_json's own formatting of an f64, as the conversion through its value writes it.
        serde_json::to_writer(&mut self.out, &x).map_err(|e| invalid(e.to_string()))
    }

    fn text(&mut self, what: &str) -> Result<&'a str, Unwritten> {
        let n = self.len(what)?;
        let bytes = self.take(n, what)?;
        std::str::from_utf8(bytes).map_err(|_| invalid(format!("{what} is not UTF-8")))
    }

    fn string(&mut self, s: &str) {
        // Writing a &str into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.out, s);
    }

    fn byte_array(&mut self, bytes: &[u8]) {
        self.out.push(b'[');
        for (i, b) in bytes.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.number(*b);
        }
        self.out.push(b']');
    }

    /// Writes one value of `schema` (no deeper than [`MAX_DEPTH`]: [`writable`] checked it).
    fn value(&mut self, schema: &Schema) -> Result<(), Unwritten> {
        self.room()?;
        match schema {
            Schema::Null => self.out.extend_from_slice(b"null"),
            Schema::Boolean => match self.take(1, "a boolean")? {
                [0] => self.out.extend_from_slice(b"false"),
                [1] => self.out.extend_from_slice(b"true"),
                [b, ..] => return Err(invalid(format!("{b} is not a valid boolean"))),
                [] => return Err(invalid("the payload ends inside a boolean")),
            },
            Schema::Int | Schema::Date | Schema::TimeMillis => {
                let n = self.int()?;
                self.number(n);
            }
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => {
                let n = self.long()?;
                self.number(n);
            }
            Schema::Float => {
                let b = self.take(4, "a float")?;
                let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                self.float(f64::from(x))?;
            }
            Schema::Double => {
                let b = self.take(8, "a double")?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                self.float(f64::from_le_bytes(a))?;
            }
            Schema::Bytes => {
                let n = self.len("bytes")?;
                let b = self.take(n, "bytes")?;
                self.byte_array(b);
            }
            Schema::String => {
                let s = self.text("a string")?;
                self.string(s);
            }
            Schema::Fixed(f) => {
                let b = self.take(f.size, "a fixed")?;
                self.byte_array(b);
            }
            Schema::Enum(e) => {
                let i = self.int()?;
                let symbol = usize::try_from(i)
                    .ok()
                    .and_then(|i| e.symbols.get(i))
                    .ok_or_else(|| {
                        invalid(format!("enum index {i} of {} symbols", e.symbols.len()))
                    })?;
                self.string(symbol);
            }
            Schema::Union(u) => {
                let i = self.long()?;
                let branch = usize::try_from(i)
                    .ok()
                    .and_then(|i| u.variants().get(i))
                    .ok_or_else(|| {
                        invalid(format!(
                            "union index {i} of {} branches",
                            u.variants().len()
                        ))
                    })?;
                self.value(branch)?;
            }
            Schema::Array(a) => {
                self.out.push(b'[');
                let mut first = true;
                loop {
                    let n = self.block()?;
                    if n == 0 {
                        break;
                    }
                    for _ in 0..n {
                        if !first {
                            self.out.push(b',');
                        }
                        first = false;
                        self.value(&a.items)?;
                    }
                }
                self.out.push(b']');
            }
            Schema::Map(m) => {
                self.out.push(b'{');
                let mut keys: Vec<&str> = Vec::new();
                loop {
                    let n = self.block()?;
                    if n == 0 {
                        break;
                    }
                    for _ in 0..n {
                        let key = self.text("a map key")?;
                        if keys.contains(&key) {
                            return Err(Unwritten::Fallback);
                        }
                        if !keys.is_empty() {
                            self.out.push(b',');
                        }
                        keys.push(key);
                        self.string(key);
                        self.out.push(b':');
                        self.value(&m.types)?;
                    }
                }
                self.out.push(b'}');
            }
            Schema::Record(r) => {
                self.out.push(b'{');
                for (i, field) in r.fields.iter().enumerate() {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    self.string(&field.name);
                    self.out.push(b':');
                    self.value(&field.schema)?;
                }
                self.out.push(b'}');
            }
            Schema::Decimal(_)
            | Schema::BigDecimal
            | Schema::Uuid(_)
            | Schema::Duration(_)
            | Schema::Ref { .. } => return Err(Unwritten::Fallback),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::types::Value;

    /// apache-avro's way, the one this must agree with: decode, convert, write.
    fn reference(schema: &Schema, payload: &[u8]) -> Result<serde_json::Value, ()> {
        let mut reader = payload;
        let value = apache_avro::reader::datum::GenericDatumReader::builder(schema)
            .build()
            .and_then(|r| r.read_value(&mut reader))
            .map_err(|_| ())?;
        if !reader.is_empty() {
            return Err(());
        }
        serde_json::Value::try_from(value).map_err(|_| ())
    }

    fn ours(schema: &Schema, payload: &[u8]) -> Result<serde_json::Value, String> {
        match to_json(schema, payload) {
            Ok(json) => Ok(serde_json::from_slice(&json).expect("our output is JSON")),
            Err(Unwritten::Invalid(why)) => Err(why),
            Err(Unwritten::Fallback) => reference(schema, payload).map_err(|()| "refused".into()),
        }
    }

    const SCHEMAS: &[&str] = &[
        r#"{"type":"record","name":"Order","fields":[
            {"name":"id","type":"string"},{"name":"amount","type":"double"},
            {"name":"qty","type":"int"},{"name":"big","type":"long"},{"name":"ok","type":"boolean"},
            {"name":"ratio","type":"float"},{"name":"raw","type":"bytes"},
            {"name":"tags","type":{"type":"array","items":"string"}},
            {"name":"attrs","type":{"type":"map","values":["null","long","string"]}},
            {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["A","B","C"]}},
            {"name":"hash","type":{"type":"fixed","name":"H","size":4}},
            {"name":"note","type":["null","string"],"default":null},
            {"name":"day","type":{"type":"int","logicalType":"date"}},
            {"name":"at","type":{"type":"long","logicalType":"timestamp-micros"}},
            {"name":"inner","type":{"type":"record","name":"Inner","fields":[
                {"name":"x","type":"null"},{"name":"ys","type":{"type":"array","items":
                    {"type":"array","items":"double"}}}]}}]}"#,
        r#"["null","int","string",{"type":"array","items":"boolean"}]"#,
        r#"{"type":"map","values":{"type":"array","items":"long"}}"#,
        r#""double""#,
    ];

    /// apache-avro's writer's bytes of `value`.
    fn encode(schema: &Schema, value: Value) -> Vec<u8> {
        apache_avro::writer::datum::GenericDatumWriter::builder(schema)
            .build()
            .and_then(|w| w.write_value_to_vec(value))
            .expect("encodes")
    }

    /// A small deterministic generator (xorshift), so a failure replays.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    fn text(rng: &mut Rng) -> String {
        let pool = [
            "",
            "a",
            "é",
            "\"q\"",
            "line\nbreak",
            "tab\t",
            "😀",
            "\\",
            "x\u{1}",
        ];
        (0..rng.below(4))
            .map(|_| pool[rng.below(pool.len() as u64) as usize])
            .collect()
    }

    /// A random value of `schema`, as apache-avro's writer takes it.
    fn random(schema: &Schema, rng: &mut Rng) -> Value {
        match schema {
            Schema::Null => Value::Null,
            Schema::Boolean => Value::Boolean(rng.below(2) == 1),
            Schema::Int => Value::Int(rng.next() as i32 >> rng.below(31)),
            Schema::Long => Value::Long(rng.next() as i64 >> rng.below(63)),
            Schema::Float => Value::Float((rng.next() as i32 >> 8) as f32 / 7.0),
            Schema::Double => Value::Double((rng.next() as i64 >> 11) as f64 / 3.0),
            Schema::Bytes => Value::Bytes((0..rng.below(5)).map(|_| rng.next() as u8).collect()),
            Schema::String => Value::String(text(rng)),
            Schema::Date => Value::Date(rng.next() as i32 >> 8),
            Schema::TimestampMicros => Value::TimestampMicros(rng.next() as i64 >> 4),
            Schema::Fixed(f) => {
                Value::Fixed(f.size, (0..f.size).map(|_| rng.next() as u8).collect())
            }
            Schema::Enum(e) => {
                let i = rng.below(e.symbols.len() as u64) as usize;
                Value::Enum(i as u32, e.symbols[i].clone())
            }
            Schema::Union(u) => {
                let i = rng.below(u.variants().len() as u64) as usize;
                Value::Union(i as u32, Box::new(random(&u.variants()[i], rng)))
            }
            Schema::Array(a) => {
                Value::Array((0..rng.below(4)).map(|_| random(&a.items, rng)).collect())
            }
            Schema::Map(m) => Value::Map(
                (0..rng.below(4))
                    .map(|i| (format!("k{i}{}", text(rng)), random(&m.types, rng)))
                    .collect(),
            ),
            Schema::Record(r) => Value::Record(
                r.fields
                    .iter()
                    .map(|f| (f.name.clone(), random(&f.schema, rng)))
                    .collect(),
            ),
            other => panic!("no generator for {other:?}"),
        }
    }

    #[test]
    fn every_value_is_written_as_apache_avros_conversion_writes_it() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for text in SCHEMAS {
            let schema = Schema::parse_str(text).expect("schema");
            assert!(writable(&schema), "{text}");
            for _ in 0..400 {
                let value = random(&schema, &mut rng);
                let bytes = encode(&schema, value);
                assert_eq!(
                    ours(&schema, &bytes).ok(),
                    reference(&schema, &bytes).ok(),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn any_bytes_are_refused_or_written_as_apache_avro_reads_them() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for text in SCHEMAS {
            let schema = Schema::parse_str(text).expect("schema");
            for _ in 0..3000 {
                let valid = encode(&schema, random(&schema, &mut rng));
                // A valid payload with some bytes changed, cut or extended.
                let mut bytes = valid.clone();
                for _ in 0..=rng.below(3) {
                    match rng.below(3) {
                        0 if !bytes.is_empty() => {
                            let i = rng.below(bytes.len() as u64) as usize;
                            bytes[i] = rng.next() as u8;
                        }
                        1 => bytes.truncate(rng.below(bytes.len() as u64 + 1) as usize),
                        _ => bytes.push(rng.next() as u8),
                    }
                }
                match (ours(&schema, &bytes), reference(&schema, &bytes)) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "{text}: {bytes:?}"),
                    (Err(_), Err(())) => {}
                    // Only where apache-avro reads a cut payload as null, and this refuses it.
                    (Err(why), Ok(b)) => assert!(
                        (why == ENDS_EARLY || why.ends_with(LEFT))
                            && b.to_string().contains("null"),
                        "{text}: {bytes:?}: refused ({why}) what apache-avro reads as {b}"
                    ),
                    (Ok(a), Err(())) => {
                        panic!("{text}: {bytes:?}: read as {a}, refused by apache-avro")
                    }
                }
            }
        }
    }

    #[test]
    fn a_hostile_count_is_stopped_by_the_output_bound_and_lengths_by_the_bytes_left() {
        let nulls = Schema::parse_str(r#"{"type":"array","items":"null"}"#).expect("schema");
        // One block claiming 2^62 nulls, each one written as `null,`.
        let mut claim = vec![0x80u8; 8];
        claim.push(0x7f);
        claim.push(0);
        let Err(Unwritten::Invalid(why)) = to_json(&nulls, &claim) else {
            panic!("a billion nulls written");
        };
        assert!(why.contains("MiB as JSON"), "{why}");
        let strings = Schema::parse_str(r#""string""#).expect("schema");
        assert_eq!(
            to_json(&strings, &[0xfe, 0xff, 0xff, 0xff, 0x0f, b'x']),
            Err(invalid("a string of 2147483647 bytes, but 1 are left"))
        );
        assert_eq!(
            to_json(&strings, &[0x81; 11]),
            Err(invalid("a number longer than 10 bytes"))
        );
    }

    #[test]
    fn what_it_cannot_write_exactly_is_left_to_apache_avro() {
        for text in [
            r#"{"type":"bytes","logicalType":"decimal","precision":4,"scale":2}"#,
            r#"{"type":"fixed","name":"D","size":12,"logicalType":"duration"}"#,
            r#"{"type":"string","logicalType":"uuid"}"#,
            r#"{"type":"record","name":"P","fields":[{"name":"a","type":{"type":"fixed","name":"F","size":2}},{"name":"b","type":"F"}]}"#,
        ] {
            let schema = Schema::parse_str(text).expect("schema");
            assert!(!writable(&schema), "{text}");
        }
        let map = Schema::parse_str(r#"{"type":"map","values":"int"}"#).expect("schema");
        // Two entries with the key "a": a JSON object keeps one, as apache-avro's map does.
        assert_eq!(
            to_json(&map, &[4, 2, b'a', 2, 2, b'a', 4, 0]),
            Err(Unwritten::Fallback)
        );
    }
}
