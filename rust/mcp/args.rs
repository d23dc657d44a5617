//! Tool arguments checked against the tool's input schema before rmcp
//! decodes them, so a mistake comes back as an `Error:` naming the argument
//! and what it takes (serde's message names neither), and so the spellings
//! models commonly send are accepted: a number or boolean as a string (`"5"`,
//! `"true"`), a whole number as `5.0`, `null` for an optional argument.
use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use serde_json::{Number, Value};

/// Makes `args` fit `schema` (a tool's input schema) where that is safe, or
/// says which argument does not fit and why.
pub fn conform(schema: &JsonObject, args: &mut JsonObject) -> Result<(), String> {
    let empty = JsonObject::new();
    let properties = schema.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let required: Vec<&str> =
        schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    for name in &required {
        if args.get(*name).is_none_or(Value::is_null) {
            return Err(format!("argument `{name}` is required"));
        }
    }
    let names: Vec<String> = args.keys().cloned().collect();
    for name in names {
        let Some(property) = properties.get(&name).and_then(Value::as_object) else {
            continue;
        };
        let property = resolve(schema, property);
        let types = types_of(property);
        let value = args.get_mut(&name).expect("a key just listed");
        if value.is_null() && !types.contains(&"null") {
            // An optional argument sent as null means "not given": its default applies.
            args.remove(&name);
            continue;
        }
        coerce(value, &types);
        check(&name, value, property, &types)?;
    }
    Ok(())
}

/// What rmcp's tool router says when arguments that passed [`conform`]
/// still do not decode.
const RMCP_DECODE_ERROR: &str = "failed to deserialize parameters: ";

/// Gives that message the `Error:` every other failed call starts with.
pub fn prefix_decode_error(result: &mut CallToolResult) {
    if result.is_error != Some(true) {
        return;
    }
    for block in &mut result.content {
        if let ContentBlock::Text(text) = block
            && let Some(detail) = text.text.strip_prefix(RMCP_DECODE_ERROR)
        {
            text.text = format!("Error: invalid arguments: {detail}");
        }
    }
}

/// The schema a `$ref` to the root's `$defs` points to, else `property`.
fn resolve<'a>(root: &'a JsonObject, property: &'a JsonObject) -> &'a JsonObject {
    property
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .and_then(|name| root.get("$defs")?.get(name)?.as_object())
        .unwrap_or(property)
}

/// The JSON types `property` allows (empty: it does not say).
fn types_of(property: &JsonObject) -> Vec<&str> {
    match property.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Rewrites a value in a spelling the schema does not take but clearly
/// means one it does: numbers and booleans sent as strings, whole floats
/// where an integer goes.
fn coerce(value: &mut Value, types: &[&str]) {
    let wants = |t: &str| types.contains(&t);
    let new = match &*value {
        Value::String(s) if !wants("string") => {
            let s = s.trim();
            if wants("integer")
                && let Ok(n) = s.parse::<i64>()
            {
                Some(Value::from(n))
            } else if wants("integer")
                && let Ok(n) = s.parse::<u64>()
            {
                Some(Value::from(n))
            } else if wants("number")
                && let Some(n) = s.parse::<f64>().ok().and_then(Number::from_f64)
            {
                Some(Value::Number(n))
            } else if wants("boolean") && (s == "true" || s == "false") {
                Some(Value::Bool(s == "true"))
            } else {
                None
            }
        }
        Value::Number(n) if wants("integer") && !wants("number") && n.is_f64() => {
            n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15).map(|f| Value::from(f as i64))
        }
        _ => None,
    };
    if let Some(new) = new {
        *value = new;
    }
}

/// What `types` reads as in a message.
fn expected(types: &[&str]) -> String {
    let words: Vec<&str> = types
        .iter()
        .filter(|t| **t != "null")
        .map(|t| match *t {
            "integer" => "a whole number",
            "number" => "a number",
            "string" => "a string",
            "boolean" => "true or false",
            "array" => "a list",
            "object" => "an object",
            other => other,
        })
        .collect();
    words.join(" or ")
}

/// What `value` is, for a message.
fn described(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) if s.chars().count() > 40 => "a long string".into(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn has_type(value: &Value, t: &str) -> bool {
    match t {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => true,
    }
}

fn check(name: &str, value: &Value, property: &JsonObject, types: &[&str]) -> Result<(), String> {
    if !types.is_empty() && !types.iter().any(|t| has_type(value, t)) {
        return Err(format!("argument `{name}` must be {}, not {}", expected(types), described(value)));
    }
    if let Some(allowed) = property.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> =
            allowed.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string)).collect();
        return Err(format!("argument `{name}` must be one of {}, not {}", list.join(", "), described(value)));
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = property.get("minimum").and_then(Value::as_f64)
            && n < min
        {
            return Err(format!("argument `{name}` must be at least {min}, not {}", described(value)));
        }
        if let Some(max) = property.get("maximum").and_then(Value::as_f64)
            && n > max
        {
            return Err(format!("argument `{name}` must be at most {max}, not {}", described(value)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> JsonObject {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout": {"type": "number", "default": 30.0},
                "tail": {"type": "integer", "minimum": 0, "maximum": 4294967295u64},
                "follow": {"type": "boolean"},
                "limit": {"type": ["integer", "null"]},
                "action": {"type": "string", "enum": ["set", "unset", "list"]},
                "mode": {"$ref": "#/$defs/Mode"}
            },
            "required": ["command"],
            "$defs": {"Mode": {"type": "string", "enum": ["ro", "rw"]}}
        })
        .as_object()
        .unwrap()
        .clone()
    }

    fn conformed(args: Value) -> Result<Value, String> {
        let mut args = args.as_object().unwrap().clone();
        conform(&schema(), &mut args).map(|()| Value::Object(args))
    }

    #[test]
    fn strings_that_mean_numbers_and_booleans_are_taken() {
        let got = conformed(json!({"command": "x", "timeout": " 5 ", "tail": "7", "follow": "true", "limit": 3.0}));
        assert_eq!(got.unwrap(), json!({"command": "x", "timeout": 5.0, "tail": 7, "follow": true, "limit": 3}));
        let got = conformed(json!({"command": "x", "timeout": "2.5", "limit": null, "follow": null}));
        assert_eq!(got.unwrap(), json!({"command": "x", "timeout": 2.5, "limit": null}));
    }

    #[test]
    fn what_rmcp_still_refuses_reads_as_an_error() {
        let mut result =
            CallToolResult::error(vec![ContentBlock::text(format!("{RMCP_DECODE_ERROR}missing field `x`"))]);
        prefix_decode_error(&mut result);
        assert_eq!(
            result.content[0].as_text().map(|t| t.text.as_str()),
            Some("Error: invalid arguments: missing field `x`")
        );
    }

    #[test]
    fn mistakes_name_the_argument_and_what_it_takes() {
        let err = |args: Value| conformed(args).unwrap_err();
        assert_eq!(err(json!({"timeout": 1})), "argument `command` is required");
        assert_eq!(err(json!({"command": 5})), "argument `command` must be a string, not 5");
        assert_eq!(
            err(json!({"command": "x", "timeout": "soon"})),
            "argument `timeout` must be a number, not \"soon\""
        );
        assert_eq!(err(json!({"command": "x", "tail": [1]})), "argument `tail` must be a whole number, not a list");
        assert_eq!(err(json!({"command": "x", "tail": -1})), "argument `tail` must be at least 0, not -1");
        assert_eq!(err(json!({"command": "x", "tail": 2.5})), "argument `tail` must be a whole number, not 2.5");
        assert_eq!(
            err(json!({"command": "x", "action": "explode"})),
            "argument `action` must be one of set, unset, list, not \"explode\""
        );
        assert_eq!(err(json!({"command": "x", "mode": "rx"})), "argument `mode` must be one of ro, rw, not \"rx\"");
    }
}
