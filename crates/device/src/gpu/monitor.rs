//! Live GPU monitor: a sampler thread that reads the process's NVML handle, samples device memory,
//! utilisation and per-process memory every [`SAMPLE_PERIOD`], and sends the samples
//! through a bounded channel. The thread stops when its [`Monitor`] is dropped.
//!
//! The pure part — [`MonitorModel`]: the ring buffer of the last [`WINDOW_SECS`]
//! and the state (running, no NVML, lost) — is fed events and tested without a GPU;
//! the device is behind [`SampleSource`], so tests feed fake samples.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TrySendError, channel};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use nvml_wrapper::Nvml;

use vramlab_core::units::Bytes;

/// Time between samples.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(500);
/// How much history the monitor keeps.
pub const WINDOW_SECS: f64 = 600.0;
/// Samples buffered between the thread and the UI (the UI drains every frame).
const CHANNEL_CAPACITY: usize = 64;

/// The message shown when NVML cannot be opened.
pub const NO_NVML: &str = "No NVIDIA driver/GPU: the monitor needs NVML (libnvidia-ml.so.1)";

/// One process using the GPU, like a row of nvitop.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessUsage {
    pub pid: u32,
    /// `/proc/<pid>/comm`, or `pid <n>` where it cannot be read.
    pub name: String,
    /// Device memory of the process (`None` where the driver does not say).
    pub used: Option<Bytes>,
}

/// What a source reads at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub used: Bytes,
    pub total: Bytes,
    /// GPU utilisation in percent over the driver's last sample period.
    pub util_pct: Option<u32>,
    pub processes: Vec<ProcessUsage>,
}

/// One sample of the series.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSample {
    /// Seconds since the monitor started.
    pub t_secs: f64,
    pub reading: Reading,
}

/// A device to sample (NVML in the app, a script in tests).
pub trait SampleSource: Send {
    /// Device name for headings ("NVIDIA H200").
    fn device_name(&self) -> String;
    fn read(&mut self) -> Result<Reading>;
}

/// What the sampler thread sends.
#[derive(Debug, Clone, PartialEq)]
pub enum MonitorEvent {
    Opened {
        device: String,
    },
    Sample(GpuSample),
    /// The source could not be opened (no driver, no GPU).
    Unavailable(String),
    /// A read failed after the source was open (driver error, GPU gone); the thread ends.
    Lost(String),
}

/// Where the monitor stands.
#[derive(Debug, Clone, PartialEq)]
pub enum MonitorState {
    Starting,
    Running {
        device: String,
    },
    /// NVML could not be opened: the message says why.
    Unavailable(String),
    /// Sampling stopped after an error; the series keeps what was measured.
    Lost {
        device: String,
        message: String,
    },
}

impl MonitorState {
    /// The message to show instead of (or above) the plots, if any.
    pub fn message(&self) -> Option<String> {
        match self {
            MonitorState::Starting | MonitorState::Running { .. } => None,
            MonitorState::Unavailable(m) => Some(m.clone()),
            MonitorState::Lost { device, message } => Some(format!(
                "Monitoring {device} stopped: {message}. The samples up to the failure are kept."
            )),
        }
    }
}

/// The state and the last [`WINDOW_SECS`] of samples (pure; fed [`MonitorEvent`]s).
#[derive(Debug, Clone)]
pub struct MonitorModel {
    pub state: MonitorState,
    samples: VecDeque<GpuSample>,
    window_secs: f64,
}

impl Default for MonitorModel {
    fn default() -> Self {
        MonitorModel::new(WINDOW_SECS)
    }
}

impl MonitorModel {
    pub fn new(window_secs: f64) -> MonitorModel {
        MonitorModel {
            state: MonitorState::Starting,
            samples: VecDeque::new(),
            window_secs,
        }
    }

    pub fn apply(&mut self, event: MonitorEvent) {
        match event {
            MonitorEvent::Opened { device } => self.state = MonitorState::Running { device },
            MonitorEvent::Sample(s) => {
                let cutoff = s.t_secs - self.window_secs;
                while self.samples.front().is_some_and(|f| f.t_secs < cutoff) {
                    self.samples.pop_front();
                }
                self.samples.push_back(s);
            }
            MonitorEvent::Unavailable(m) => self.state = MonitorState::Unavailable(m),
            MonitorEvent::Lost(message) => {
                let device = match &self.state {
                    MonitorState::Running { device } | MonitorState::Lost { device, .. } => {
                        device.clone()
                    }
                    _ => "the GPU".to_string(),
                };
                self.state = MonitorState::Lost { device, message };
            }
        }
    }

    pub fn samples(&self) -> impl ExactSizeIterator<Item = &GpuSample> {
        self.samples.iter()
    }

    pub fn latest(&self) -> Option<&GpuSample> {
        self.samples.back()
    }

    /// Device used memory as plot points: x = seconds relative to the latest sample
    /// (≤ 0), y = GiB.
    pub fn used_points(&self) -> Vec<[f64; 2]> {
        self.relative(|r| Some(r.used.as_gib_f64()))
    }

    /// Utilisation in percent, as plot points like [`Self::used_points`].
    pub fn util_points(&self) -> Vec<[f64; 2]> {
        self.relative(|r| r.util_pct.map(f64::from))
    }

    fn relative(&self, y: impl Fn(&Reading) -> Option<f64>) -> Vec<[f64; 2]> {
        let Some(last) = self.latest().map(|s| s.t_secs) else {
            return Vec::new();
        };
        self.samples
            .iter()
            .filter_map(|s| y(&s.reading).map(|v| [s.t_secs - last, v]))
            .collect()
    }

    /// Highest device used memory in the window.
    pub fn peak_used(&self) -> Option<Bytes> {
        self.samples.iter().map(|s| s.reading.used).max()
    }
}

/// Opens a source on the sampler thread (NVML handles are opened where they are used).
pub type SourceFactory = Box<dyn FnOnce() -> Result<Box<dyn SampleSource>> + Send>;

/// A running sampler. Dropping it stops the thread within one period.
pub struct Monitor {
    rx: Receiver<MonitorEvent>,
    _stop: Sender<()>,
    pub model: MonitorModel,
}

impl Monitor {
    /// Samples NVML device `index`.
    pub fn start_nvml(index: u32, notify: Box<dyn Fn() + Send>) -> Monitor {
        Monitor::start(
            Box::new(move || Ok(Box::new(NvmlSource::open(index)?) as Box<dyn SampleSource>)),
            SAMPLE_PERIOD,
            notify,
        )
    }

    /// Samples whatever `open` returns every `period`; `notify` is called after each event
    /// (the GUI passes a repaint request).
    pub fn start(open: SourceFactory, period: Duration, notify: Box<dyn Fn() + Send>) -> Monitor {
        let (tx, rx) = std::sync::mpsc::sync_channel(CHANNEL_CAPACITY);
        let (stop, stop_rx) = channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("vramlab-monitor".into())
            .spawn(move || sample_loop(open, period, &tx, &stop_rx, notify.as_ref()));
        let mut model = MonitorModel::default();
        if let Err(e) = spawned {
            model.apply(MonitorEvent::Unavailable(format!(
                "could not start the monitor thread: {e}"
            )));
        }
        Monitor {
            rx,
            _stop: stop,
            model,
        }
    }

    /// Applies the events that arrived since the last call (never blocks).
    pub fn poll(&mut self) {
        for e in self.rx.try_iter() {
            self.model.apply(e);
        }
    }
}

fn sample_loop(
    open: SourceFactory,
    period: Duration,
    tx: &SyncSender<MonitorEvent>,
    stop: &Receiver<()>,
    notify: &(dyn Fn() + Send),
) {
    // Samples may be dropped when the UI is behind; state changes may not.
    let send = |e: MonitorEvent, droppable: bool| -> bool {
        let ok = if droppable {
            !matches!(tx.try_send(e), Err(TrySendError::Disconnected(_)))
        } else {
            tx.send(e).is_ok()
        };
        notify();
        ok
    };
    let mut source = match open() {
        Ok(s) => s,
        Err(e) => {
            send(
                MonitorEvent::Unavailable(format!("{NO_NVML}: {e:#}")),
                false,
            );
            return;
        }
    };
    if !send(
        MonitorEvent::Opened {
            device: source.device_name(),
        },
        false,
    ) {
        return;
    }
    let start = Instant::now();
    loop {
        match source.read() {
            Ok(reading) => {
                let s = GpuSample {
                    t_secs: start.elapsed().as_secs_f64(),
                    reading,
                };
                if !send(MonitorEvent::Sample(s), true) {
                    return;
                }
            }
            Err(e) => {
                send(MonitorEvent::Lost(format!("{e:#}")), false);
                return;
            }
        }
        match stop.recv_timeout(period) {
            Err(RecvTimeoutError::Timeout) => {}
            // The handle was dropped (or sent stop).
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// NVML device `index`, read like nvidia-smi / nvitop.
pub struct NvmlSource {
    nvml: &'static Nvml,
    index: u32,
    name: String,
}

impl NvmlSource {
    pub fn open(index: u32) -> Result<NvmlSource> {
        let nvml = super::nvml::handle()?;
        let name = nvml
            .device_by_index(index)
            .with_context(|| format!("opening NVML device {index}"))?
            .name()
            .unwrap_or_else(|_| format!("GPU {index}"));
        Ok(NvmlSource { nvml, index, name })
    }
}

impl SampleSource for NvmlSource {
    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn read(&mut self) -> Result<Reading> {
        let d = self
            .nvml
            .device_by_index(self.index)
            .with_context(|| format!("opening NVML device {}", self.index))?;
        let mem = d.memory_info().context("reading device memory")?;
        let util_pct = d.utilization_rates().ok().map(|u| u.gpu);
        let mut processes: Vec<ProcessUsage> = Vec::new();
        let lists = [
            d.running_compute_processes(),
            d.running_graphics_processes(),
        ];
        for p in lists.into_iter().flatten().flatten() {
            if processes.iter().any(|q| q.pid == p.pid) {
                continue;
            }
            let used = super::nvml::used_memory(p.used_gpu_memory);
            processes.push(ProcessUsage {
                pid: p.pid,
                name: process_name(p.pid),
                used,
            });
        }
        processes.sort_by(|a, b| b.used.cmp(&a.used).then(a.pid.cmp(&b.pid)));
        Ok(Reading {
            used: Bytes(mem.used),
            total: Bytes(mem.total),
            util_pct,
            processes,
        })
    }
}

/// `/proc/<pid>/comm` (Linux), else `pid <n>`.
pub fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("pid {pid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(used_gib: u64) -> Reading {
        Reading {
            used: Bytes::gib(used_gib),
            total: Bytes::gib(80),
            util_pct: Some(50),
            processes: vec![ProcessUsage {
                pid: 42,
                name: "python3".into(),
                used: Some(Bytes::gib(used_gib)),
            }],
        }
    }

    #[test]
    fn ring_buffer_keeps_the_window() {
        let mut m = MonitorModel::new(10.0);
        m.apply(MonitorEvent::Opened {
            device: "fake".into(),
        });
        for i in 0..50u32 {
            m.apply(MonitorEvent::Sample(GpuSample {
                t_secs: f64::from(i) * 0.5,
                reading: reading(u64::from(i % 7)),
            }));
        }
        // 24.5 s latest, window 10 s: samples at 14.5 ..= 24.5.
        assert_eq!(m.samples().len(), 21);
        let pts = m.used_points();
        assert_eq!(pts.first().map(|p| p[0]), Some(-10.0));
        assert_eq!(pts.last().map(|p| p[0]), Some(0.0));
        assert_eq!(m.peak_used(), Some(Bytes::gib(6)));
        assert_eq!(m.util_points().len(), 21);
        assert_eq!(m.state.message(), None);
    }

    /// Reads `ok` samples, then fails like a GPU that fell off the bus.
    struct Failing {
        ok: u32,
    }

    impl SampleSource for Failing {
        fn device_name(&self) -> String {
            "fake GPU".into()
        }
        fn read(&mut self) -> Result<Reading> {
            if self.ok == 0 {
                anyhow::bail!("GPU is lost (NVML_ERROR_GPU_IS_LOST)");
            }
            self.ok -= 1;
            Ok(reading(3))
        }
    }

    fn wait_until(m: &mut Monitor, done: impl Fn(&MonitorModel) -> bool) {
        let t0 = Instant::now();
        while !done(&m.model) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{:?}",
                m.model.state
            );
            std::thread::sleep(Duration::from_millis(5));
            m.poll();
        }
    }

    #[test]
    fn a_failing_source_gives_a_clear_state_and_keeps_the_samples() {
        let mut m = Monitor::start(
            Box::new(|| Ok(Box::new(Failing { ok: 3 }) as Box<dyn SampleSource>)),
            Duration::from_millis(1),
            Box::new(|| {}),
        );
        wait_until(&mut m, |m| matches!(m.state, MonitorState::Lost { .. }));
        assert_eq!(m.model.samples().len(), 3);
        let msg = m.model.state.message().expect("message");
        assert!(msg.contains("fake GPU"), "{msg}");
        assert!(msg.contains("GPU is lost"), "{msg}");
    }

    #[test]
    fn no_driver_is_unavailable_with_the_reason() {
        let mut m = Monitor::start(
            Box::new(|| {
                Err(anyhow::anyhow!(
                    "libnvidia-ml.so.1: cannot open shared object"
                ))
            }),
            Duration::from_millis(1),
            Box::new(|| {}),
        );
        wait_until(&mut m, |m| matches!(m.state, MonitorState::Unavailable(_)));
        let msg = m.model.state.message().expect("message");
        assert!(msg.starts_with(NO_NVML), "{msg}");
        assert!(msg.contains("libnvidia-ml"), "{msg}");
    }

    #[test]
    fn dropping_the_handle_stops_the_thread() {
        let (done_tx, done_rx) = channel::<()>();
        struct Forever(Sender<()>);
        impl SampleSource for Forever {
            fn device_name(&self) -> String {
                "forever".into()
            }
            fn read(&mut self) -> Result<Reading> {
                Ok(reading(1))
            }
        }
        impl Drop for Forever {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        let mut m = Monitor::start(
            Box::new(move || Ok(Box::new(Forever(done_tx)) as Box<dyn SampleSource>)),
            Duration::from_millis(20),
            Box::new(|| {}),
        );
        wait_until(&mut m, |m| m.samples().len() >= 2);
        drop(m);
        assert!(done_rx.recv_timeout(Duration::from_secs(2)).is_ok());
    }

    #[test]
    fn real_nvml_never_panics() {
        // In CI (no driver) this reports Unavailable; on a GPU machine it runs.
        let mut m = Monitor::start_nvml(0, Box::new(|| {}));
        wait_until(&mut m, |m| m.state != MonitorState::Starting);
    }
}
