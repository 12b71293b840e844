//! The order check itself, free of the plugin SDK, so the host's benchmarks can run the very
//! same source natively (`host/examples/pipeline_bench.rs` includes this file) and the Wasm /
//! native ratio compares one logic, not two copies of it.

use serde_json::Value;

/// Checks one value; `Err` is the rejection reason. `on_bad_json` sees serde's own message,
/// which differs per language and so stays out of the reason (the plugin logs it at debug).
pub fn check(
    value: Option<&[u8]>,
    max_quantity: u64,
    on_bad_json: impl FnOnce(&serde_json::Error),
) -> Result<(), String> {
    let value = value.ok_or("null value (tombstone)")?;
    // The reason is the same in every language's order-validator (examples/python, examples/js).
    let order: Value = serde_json::from_slice(value).map_err(|e| {
        on_bad_json(&e);
        "not JSON".to_owned()
    })?;
    let obj = order.as_object().ok_or("not a JSON object")?;
    for field in ["id", "sku"] {
        match obj.get(field).and_then(Value::as_str) {
            Some(s) if !s.is_empty() => {}
            Some(_) => return Err(format!("`{field}` is empty")),
            None => return Err(format!("`{field}` missing or not a string")),
        }
    }
    let quantity = obj
        .get("quantity")
        .and_then(Value::as_u64)
        .ok_or("`quantity` missing or not a non-negative integer")?;
    if quantity == 0 || quantity > max_quantity {
        return Err(format!("`quantity` {quantity} outside 1..={max_quantity}"));
    }
    match obj.get("price").and_then(Value::as_f64) {
        Some(p) if p >= 0.0 => Ok(()),
        Some(p) => Err(format!("`price` {p} is negative")),
        None => Err("`price` missing or not a number".into()),
    }
}
