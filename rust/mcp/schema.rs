//! Tool schemas as strict JSON Schema clients accept. schemars writes Rust's
//! number types as `format` (`uint32`, `int64`, `double`...), which JSON
//! Schema's format vocabulary does not have: the TypeScript SDK's validator
//! (and so Claude Code, the MCP Inspector, mcp-remote) warns about each one
//! at every start. Integer formats become the bounds they stand for, so the
//! range is still said (and [`super::args`] still checks it); other unknown
//! formats go.
use rmcp::model::JsonObject;
use serde_json::Value;

/// The `format` values JSON Schema 2020-12 defines.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// The range an integer format stands for.
fn integer_bounds(format: &str) -> Option<(i128, i128)> {
    Some(match format {
        "uint8" => (0, u8::MAX.into()),
        "uint16" => (0, u16::MAX.into()),
        "uint32" | "uint" => (0, u32::MAX.into()),
        "uint64" => (0, u64::MAX.into()),
        "int8" => (i8::MIN.into(), i8::MAX.into()),
        "int16" => (i16::MIN.into(), i16::MAX.into()),
        "int32" | "int" => (i32::MIN.into(), i32::MAX.into()),
        "int64" => (i64::MIN.into(), i64::MAX.into()),
        _ => return None,
    })
}

fn bound(n: i128) -> Value {
    // Bounds of 64-bit types fit one of these two.
    u64::try_from(n).map(Value::from).unwrap_or_else(|_| Value::from(n as i64))
}

/// Removes every non-standard `format` in `schema`, at any depth.
pub fn standardize(schema: &mut JsonObject) {
    if let Some(Value::String(format)) = schema.get("format")
        && !STANDARD_FORMATS.contains(&format.as_str())
    {
        if let Some((min, max)) = integer_bounds(format) {
            schema.entry("minimum").or_insert_with(|| bound(min));
            schema.entry("maximum").or_insert_with(|| bound(max));
        }
        schema.remove("format");
    }
    for value in schema.values_mut() {
        standardize_value(value);
    }
}

fn standardize_value(value: &mut Value) {
    match value {
        Value::Object(object) => standardize(object),
        Value::Array(items) => items.iter_mut().for_each(standardize_value),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Every `format` in `schema` that JSON Schema does not define.
    fn nonstandard_formats(schema: &Value) -> Vec<String> {
        let mut found = Vec::new();
        collect(schema, &mut found);
        found
    }

    fn collect(value: &Value, found: &mut Vec<String>) {
        match value {
            Value::Object(object) => {
                if let Some(Value::String(f)) = object.get("format")
                    && !STANDARD_FORMATS.contains(&f.as_str())
                {
                    found.push(f.clone());
                }
                object.values().for_each(|v| collect(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| collect(v, found)),
            _ => {}
        }
    }

    #[test]
    fn integer_formats_become_bounds_and_others_go() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "n": {"type": "integer", "format": "uint32", "minimum": 0},
                "t": {"type": "number", "format": "double"},
                "at": {"type": "string", "format": "date-time"},
                "format": {"type": "string"},
                "list": {"type": "array", "items": {"type": ["integer", "null"], "format": "int64"}}
            }
        });
        let Value::Object(object) = &mut schema else { unreachable!() };
        standardize(object);
        assert!(nonstandard_formats(&schema).is_empty(), "{schema}");
        assert_eq!(schema["properties"]["n"], json!({"type": "integer", "minimum": 0, "maximum": 4294967295u64}));
        assert_eq!(schema["properties"]["t"], json!({"type": "number"}));
        assert_eq!(schema["properties"]["at"]["format"], "date-time");
        assert_eq!(schema["properties"]["format"], json!({"type": "string"}));
        assert_eq!(schema["properties"]["list"]["items"]["minimum"], json!(i64::MIN));
    }
}
