//! The "Custom model" editor: every builder parameter of the selected preset, edited
//! through the preset's JSON document so that any family (and any field added to a
//! family later) is editable without code here. Validation is the model's own
//! (`Preset::from_value`); its error text is shown, never a panic.

use egui::{DragValue, Ui};
use serde_json::{Map, Value};

/// Known values of string (enum) parameters; other strings get a text field.
fn string_options(key: &str) -> Option<&'static [&'static str]> {
    match key {
        "block" => Some(&["basic", "bottleneck"]),
        "arch" => Some(&["small", "large"]),
        "activation_function" => Some(&["gelu_new", "gelu", "gelu_pytorch_tanh", "relu"]),
        _ => None,
    }
}

/// A value for an optional parameter switched from "auto" to explicit.
fn explicit_default(key: &str, params: &Map<String, Value>) -> Value {
    let n = |k: &str| params.get(k).and_then(Value::as_u64);
    match key {
        "n_inner" => Value::from(n("n_embd").map_or(3072, |e| 4 * e)),
        _ => Value::from(1u64),
    }
}

fn edit_number(ui: &mut Ui, label: egui::Id, v: &mut Value) -> bool {
    if let Some(mut x) = v.as_u64() {
        let speed = (x as f64 / 200.0).max(0.05);
        let changed = ui
            .add(
                DragValue::new(&mut x)
                    .range(0..=u64::from(u32::MAX))
                    .speed(speed),
            )
            .labelled_by(label)
            .changed();
        if changed {
            *v = Value::from(x);
        }
        changed
    } else if let Some(mut x) = v.as_f64() {
        let changed = ui
            .add(
                DragValue::new(&mut x)
                    .range(0.0..=16.0)
                    .speed(0.01)
                    .max_decimals(4),
            )
            .labelled_by(label)
            .changed();
        if changed {
            // Keep it a float in JSON even when it is a whole number.
            *v = serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number);
        }
        changed
    } else {
        false
    }
}

/// One parameter's widget; returns whether it changed.
fn edit_value(
    ui: &mut Ui,
    key: &str,
    label: egui::Id,
    v: &mut Value,
    nullable: bool,
    params_for_default: &Map<String, Value>,
) -> bool {
    match v {
        Value::Bool(b) => ui.checkbox(b, "").labelled_by(label).changed(),
        Value::Number(_) => {
            let mut changed = false;
            ui.horizontal(|ui| {
                changed |= edit_number(ui, label, v);
                if nullable {
                    let mut auto = false;
                    if ui.checkbox(&mut auto, "auto").changed() {
                        *v = Value::Null;
                        changed = true;
                    }
                }
            });
            changed
        }
        Value::Null => {
            let mut auto = true;
            let changed = ui.checkbox(&mut auto, "auto").labelled_by(label).changed();
            if changed {
                *v = explicit_default(key, params_for_default);
            }
            changed
        }
        Value::String(s) => match string_options(key) {
            Some(options) => {
                let mut changed = false;
                egui::ComboBox::from_id_salt(("custom", key))
                    .selected_text(s.as_str())
                    .show_ui(ui, |ui| {
                        for o in options {
                            if ui.selectable_label(s == o, *o).clicked() && s != o {
                                *s = (*o).to_string();
                                changed = true;
                            }
                        }
                    })
                    .response
                    .labelled_by(label);
                changed
            }
            None => ui
                .add(egui::TextEdit::singleline(s).desired_width(140.0))
                .labelled_by(label)
                .changed(),
        },
        Value::Array(items) => {
            let mut changed = false;
            ui.horizontal(|ui| {
                for item in items.iter_mut() {
                    changed |= match item {
                        Value::Bool(b) => ui.checkbox(b, "").labelled_by(label).changed(),
                        other => edit_number(ui, label, other),
                    };
                }
            });
            changed
        }
        Value::Object(_) => {
            ui.label("(nested)");
            false
        }
    }
}

/// Draws the editor for `doc` (a preset document). `nullable` lists parameters that may
/// be `null` ("auto"). Returns the edited document — with `id` = "custom" — on a change.
pub fn custom_model_ui(ui: &mut Ui, doc: &Value, nullable: &[String]) -> Option<Value> {
    // Only the edited parts are copied each frame; the whole document once something changed.
    let mut channels = doc.get("input").and_then(|i| i.get("channels")).cloned();
    let mut params = doc.get("params").and_then(Value::as_object).cloned();
    let params_snapshot = params.clone().unwrap_or_default();
    let mut changed = false;
    egui::Grid::new("custom_model_grid")
        .num_columns(2)
        .striped(true)
        .spacing([12.0, 4.0])
        .show(ui, |ui| {
            if let Some(ch) = channels.as_mut() {
                let l = ui.label("channels").id;
                changed |= edit_number(ui, l, ch);
                ui.end_row();
            }
            if let Some(params) = params.as_mut() {
                for (key, v) in params.iter_mut() {
                    let l = ui.label(key.as_str()).id;
                    let nullable = nullable.iter().any(|k| k == key);
                    changed |= edit_value(ui, key, l, v, nullable, &params_snapshot);
                    ui.end_row();
                }
            }
        });
    if !changed {
        return None;
    }
    let mut doc = doc.clone();
    if let (Some(ch), Some(Value::Object(input))) = (channels, doc.get_mut("input")) {
        input.insert("channels".into(), ch);
    }
    if let (Some(p), Value::Object(obj)) = (params, &mut doc) {
        obj.insert("params".into(), Value::Object(p));
    }
    if let Value::Object(obj) = &mut doc {
        let was_custom = obj.get("id").and_then(Value::as_str) == Some("custom");
        if !was_custom {
            let base = obj
                .get("display_name")
                .and_then(Value::as_str)
                .unwrap_or("preset")
                .to_string();
            obj.insert(
                "display_name".into(),
                Value::from(format!("Custom ({base})")),
            );
        }
        obj.insert("id".into(), Value::from("custom"));
    }
    Some(doc)
}

/// Parameters that are `null` in the preset document (optional, "auto").
pub fn nullable_params(doc: &Value) -> Vec<String> {
    doc.get("params")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter(|(_, v)| v.is_null())
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default()
}
