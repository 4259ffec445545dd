//! Opening or dropping a captured graph (`*.vramlab-graph.json`, from `vramlab capture`):
//! the file's JSON becomes the custom model, planned from its events. Settings that change
//! the recorded step (precision, optimizer, loop, checkpointing, input size) show the
//! planner's "re-capture with …" message instead of a plan.

use crate::ui::message::Message;
use vramlab_core::model::Preset;
use vramlab_core::model::captured::is_graph_text;

/// Whether `text` is a captured graph file.
pub fn is_graph(text: &str) -> bool {
    is_graph_text(text)
}

/// Parses `text` (checked: the fit, the fields) and keeps it as the custom model.
pub fn open(
    custom: &mut Option<crate::ui::custom_doc::CustomDoc>,
    source: &str,
    text: &str,
) -> Message {
    let parsed = serde_json::from_str::<serde_json::Value>(text)
        .map_err(|e| format!("not valid JSON: {e}"))
        .and_then(|v| match Preset::from_value(&v) {
            Ok(p) => Ok((v, p)),
            Err(e) => Err(format!("{e:#}")),
        });
    match parsed {
        Ok((v, p)) => {
            *custom = Some(v.into());
            let settings = match &p.spec {
                vramlab_core::model::ModelSpec::Captured(c) => format!(
                    " (captured with {}, {}, loop {}{}; changing these needs `vramlab capture` again)",
                    c.settings.precision,
                    c.settings.optimizer,
                    c.settings.loop_shape,
                    if c.settings.checkpointing {
                        ", checkpointing"
                    } else {
                        ""
                    }
                ),
                _ => String::new(),
            };
            Message {
                text: format!(
                    "Opened captured graph {source}: {}{settings}",
                    p.display_name
                ),
                is_error: false,
            }
        }
        Err(e) => Message {
            text: format!("Could not open {source}: {e}"),
            is_error: true,
        },
    }
}
