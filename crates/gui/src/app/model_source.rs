//! A Hugging Face Hub id (`ORG/NAME[@REVISION]`) or a model folder typed in the model
//! picker's search field, typed in the "open by path" window or dropped on the window: read
//! on a worker thread through `vramlab_hub::source::load`, the function the command line's
//! `--model` calls, and the result made the custom model (a saved plan keeps it whole, so
//! it reopens without the network).

use std::sync::mpsc::TryRecvError;
use std::time::Duration;

use vramlab_core::plan::finetune_mode::FineTuneMode;
use vramlab_hub::{HubEnv, Prequantized};

use super::vram_app::VramApp;
use super::workers::Loading;
use crate::ui::message::Message;

impl VramApp {
    /// Starts reading `name` (a Hub id or a model folder) with the app's Hub settings.
    pub(super) fn load_model_source(&mut self, name: &str) {
        let (tx, rx) = std::sync::mpsc::channel();
        let env: HubEnv = self.hub_env.clone();
        let owned = name.trim().to_string();
        std::thread::spawn(move || {
            let _ = tx.send(vramlab_hub::source::load(&owned, &env).map_err(|e| e.to_string()));
        });
        self.message = Some(Message {
            text: format!("Reading {}…", name.trim()),
            is_error: false,
        });
        self.model_loading = Some(Loading {
            name: name.trim().to_string(),
            rx,
        });
        if self.hub_blocking {
            self.poll_model_source(None);
        }
    }

    /// Takes a finished read: the model becomes the custom model, or its error is shown.
    /// Whether the state changed.
    pub(super) fn poll_model_source(&mut self, ctx: Option<&egui::Context>) -> bool {
        let Some(loading) = &self.model_loading else {
            return false;
        };
        let got = if self.hub_blocking {
            loading.rx.recv().map_err(|_| TryRecvError::Disconnected)
        } else {
            loading.rx.try_recv()
        };
        let name = loading.name.clone();
        let result = match got {
            Ok(r) => r,
            Err(TryRecvError::Empty) => {
                if let Some(ctx) = ctx {
                    ctx.request_repaint_after(Duration::from_millis(100));
                }
                return false;
            }
            Err(TryRecvError::Disconnected) => Err("the reading thread stopped".to_string()),
        };
        self.model_loading = None;
        match result.and_then(|s| {
            serde_json::to_value(&s.preset)
                .map(|doc| (s, doc))
                .map_err(|e| e.to_string())
        }) {
            Ok((s, doc)) => {
                self.state.custom = Some(doc.into());
                let mut text = format!("Loaded {name}. {}", s.notes.join(" "));
                if let Some(q) = &s.prequantized {
                    text.push_str(&self.as_stored(q));
                }
                self.message = Some(Message {
                    text,
                    is_error: false,
                });
            }
            Err(e) => self.error(format!("Could not load {name}: {e}")),
        }
        true
    }

    /// A pre-quantized checkpoint planned as it is stored, as `--model` plans it: a
    /// bitsandbytes 4-bit or 8-bit base is QLoRA's base (the only way such a base trains);
    /// other storage is said not to be modelled. The sentence for the status line.
    fn as_stored(&mut self, q: &Prequantized) -> String {
        match q.qlora_base() {
            Some((quant, double)) => {
                let ft = &mut self.state.config.finetune;
                ft.mode = FineTuneMode::Qlora;
                ft.quant = quant;
                ft.double_quant = double;
                format!(
                    " The checkpoint is stored quantized ({q}): planned as stored, QLoRA \
                     adapters on the {quant} base."
                )
            }
            None => format!(
                " The checkpoint is stored quantized ({q}); that storage is not modelled: the \
                 plan holds unquantized weights."
            ),
        }
    }
}
