//! Pairs run side by side: the floor and the operator converge at the same
//! time, each run on one core, both started at once, their cores swapped
//! every quarter of a second.
//!
//! Why: this machine's speed moves by more than the ratio's 10% from one
//! half-minute to the next. The same floor took 15.2 to 20.4 s at
//! N = 5,000, its API server using 4.9 to 6.5 ms of CPU per Pet for
//! identical work, and every process of a run moved together. So a floor
//! run and an operator run one after the other compare two machines. Run at
//! once, both meet the same moment of the machine, and swapping their cores
//! gives each the same share of both (two cores differ at one moment too).
//! A floor beside a floor ([`Sides::Floors`]) shows what is left of the
//! noise. Each run has one core where the sequential pair has two: both
//! are bound by CPU, so the time still follows the CPU each run needs, and
//! a run that ends first leaves its core idle rather than to the other.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::convergence::{self, CpuSplit, FloorIdentity};
use crate::{BenchConfig, convergence_config, per_pet, procstat, runtime};
use fixtures::{Error, Result};

/// What the two runs of a side-by-side pair are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sides {
    /// The floor beside the operator: the ratio's pairs.
    FloorOperator,
    /// A floor beside a floor: what the method cannot tell apart.
    Floors,
    /// An operator run beside an operator run.
    Operators,
}

impl Sides {
    fn runs(self) -> [Side; 2] {
        match self {
            Sides::FloorOperator => [Side::Floor, Side::Operator],
            Sides::Floors => [Side::Floor, Side::Floor],
            Sides::Operators => [Side::Operator, Side::Operator],
        }
    }
}

/// One run of a side-by-side pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Floor,
    Operator,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Floor => "floor",
            Side::Operator => "operator",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "floor" => Some(Side::Floor),
            "operator" => Some(Side::Operator),
            _ => None,
        }
    }
}

/// What one run measured, from its first create until every Pet was Ready.
#[derive(Clone, Copy, Debug, Default)]
pub struct SideResult {
    pub time: Duration,
    pub cpu: CpuSplit,
    pub conversions: u64,
}

/// The two runs of a pair, in the order of [`Sides::runs`], and the core
/// the first ran on.
#[derive(Clone, Copy, Debug)]
pub struct SideBySide {
    pub first: SideResult,
    pub second: SideResult,
    pub first_cpu: usize,
}

impl SideBySide {
    /// Second ÷ first: operator ÷ floor for [`Sides::FloorOperator`].
    pub fn ratio(&self) -> f64 {
        self.second.time.as_secs_f64() / self.first.time.as_secs_f64().max(1e-9)
    }
}

/// Pins the calling thread, and every thread and process it starts later,
/// to one core.
pub fn pin_to(cpu: usize) -> Result<()> {
    if !pin_thread(0, cpu) {
        return Err(fixtures::io(format!("pinning to CPU {cpu}"))(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Pins one thread (0: the calling one) to one core; false if it could
/// not be (it has ended, say).
fn pin_thread(tid: libc::pid_t, cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and
    // sched_setaffinity only read and write the set passed to them.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Every process on the machine with its parent, read once per swap.
fn parents() -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, procstat::parent_pid(pid)?)))
        .collect()
}

/// `root` and every process below it.
fn process_tree(root: u32, parents: &[(u32, u32)]) -> Vec<u32> {
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    tree
}

/// Moves every thread of every process below `root` (and itself) to `cpu`.
fn move_tree(root: u32, cpu: usize, parents: &[(u32, u32)]) {
    for pid in process_tree(root, parents) {
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                if let Some(tid) = task.file_name().to_str().and_then(|n| n.parse().ok()) {
                    pin_thread(tid, cpu);
                }
            }
        }
    }
}

/// While the two runs of a pair converge, swaps their cores every
/// [`SWAP_EVERY`]: two cores of one machine differ in speed at the same
/// moment too (by up to 8% in a pair at N = 5,000 when each kept its
/// core), and swapping gives each run the same share of both.
struct Swapper {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

const SWAP_EVERY: Duration = Duration::from_millis(250);

impl Swapper {
    fn start(first: u32, second: u32, first_cpu: usize) -> Self {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let done = std::sync::Arc::clone(&done);
            std::thread::spawn(move || {
                let mut cpu = first_cpu;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(SWAP_EVERY);
                    cpu = 1 - cpu;
                    let parents = parents();
                    move_tree(first, cpu, &parents);
                    move_tree(second, 1 - cpu, &parents);
                }
            })
        };
        Self { done, thread }
    }

    fn stop(self) {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// The child's part: one run at `config.sizes[0]`, on the calling thread's
/// core. Says `ready` on stdout once prepared and quiet, starts on a line
/// from stdin, and prints what it measured as one JSON line.
pub fn run_side(config: &BenchConfig, side: Side) -> Result<()> {
    let pets = *config
        .sizes
        .first()
        .ok_or_else(|| protocol("a side needs one size"))?;
    let rt = runtime()?;
    let c = convergence_config(config, pets);
    serve_side(|gate| match side {
        Side::Floor => {
            let floor = convergence::measure_floor_gated(&rt, &c, false, gate)?;
            Ok(SideResult {
                time: floor.time,
                cpu: floor.cpu,
                conversions: floor.conversions,
            })
        }
        Side::Operator => {
            let run = convergence::measure_operator_convergence_gated(&rt, &c, gate)?;
            Ok(SideResult {
                time: run.converge,
                cpu: run.cpu,
                conversions: run.conversions,
            })
        }
    })
}

/// The protocol of a side around one run, whatever it measures: `measure`
/// calls its gate once prepared and quiet; the gate says `ready` on stdout
/// and returns on a line from stdin; the result is printed as one JSON line.
pub fn serve_side(measure: impl FnOnce(&dyn Fn()) -> Result<SideResult>) -> Result<()> {
    let gate = || {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "ready");
        let _ = stdout.flush();
        drop(stdout);
        let mut go = String::new();
        let _ = std::io::stdin().lock().read_line(&mut go);
    };
    let result = measure(&gate)?;
    let cpu = result.cpu;
    println!(
        "{}",
        json!({
            "time": result.time.as_secs_f64(),
            "conversions": result.conversions,
            "cpu": [cpu.api_server, cpu.etcd, cpu.bench, cpu.operator, cpu.store],
        })
    );
    Ok(())
}

/// A child process running one side.
struct Runner {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Runner {
    fn start(
        config: &BenchConfig,
        side: Side,
        pets: usize,
        cpu: usize,
        more_args: &[String],
    ) -> Result<Self> {
        let exe = match &config.side_runner {
            Some(exe) => exe.clone(),
            None => std::env::current_exe().map_err(fixtures::io("finding petstore-bench"))?,
        };
        let floor_as = match config.floor_identity {
            FloorIdentity::Operator => "operator",
            FloorIdentity::Admin => "admin",
        };
        let mut child = Command::new(exe)
            .args(["--side", side.name(), "--cpu", &cpu.to_string()])
            .args(["--sizes", &pets.to_string(), "--floor-as", floor_as])
            .args(["--concurrency", &config.concurrency.to_string()])
            .args(more_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(fixtures::io("starting a side of a pair"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(protocol("a side's pipes are missing"));
        };
        Ok(Self {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        })
    }

    fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        let read = self
            .stdout
            .read_line(&mut line)
            .map_err(fixtures::io("reading a side of a pair"))?;
        if read == 0 {
            return Err(protocol(
                "a side of the pair ended early (its error is above)",
            ));
        }
        Ok(line.trim().to_owned())
    }

    /// Waits for `ready`; anything else a side prints before it is passed on.
    fn ready(&mut self) -> Result<()> {
        loop {
            match self.line()?.as_str() {
                "ready" => return Ok(()),
                other => println!("{other}"),
            }
        }
    }

    fn go(&mut self) -> Result<()> {
        writeln!(self.stdin, "go").map_err(fixtures::io("starting a side of a pair"))
    }

    fn result(mut self) -> Result<SideResult> {
        let mut line = self.line()?;
        while !line.starts_with('{') {
            println!("{line}");
            line = self.line()?;
        }
        let _ = self.child.wait();
        let value: serde_json::Value = serde_json::from_str(&line)
            .map_err(|err| protocol(&format!("a side's result {line:?}: {err}")))?;
        let cpu: Vec<f64> = value["cpu"]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default();
        let [api_server, etcd, bench, operator, store] = cpu[..] else {
            return Err(protocol(&format!("a side's result {line:?} has no CPU")));
        };
        Ok(SideResult {
            time: Duration::from_secs_f64(value["time"].as_f64().unwrap_or(0.0)),
            conversions: value["conversions"].as_u64().unwrap_or(0),
            cpu: CpuSplit {
                api_server,
                etcd,
                bench,
                operator,
                store,
            },
        })
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        // A side left behind by an error stops; its fixtures clean up.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The pairs at each N, side by side; each pair is told to `progress` as it
/// ends.
pub fn run(
    config: &BenchConfig,
    sides: Sides,
    progress: impl Fn(&str),
) -> Result<Vec<Vec<SideBySide>>> {
    config
        .sizes
        .iter()
        .map(|&pets| pairs_at(config, pets, sides, &progress))
        .collect()
}

/// `config.pairs` pairs at `pets`, side by side.
pub fn pairs_at(
    config: &BenchConfig,
    pets: usize,
    sides: Sides,
    progress: &dyn Fn(&str),
) -> Result<Vec<SideBySide>> {
    pairs_at_with(config, pets, sides, &[], progress)
}

/// [`pairs_at`], each side started with `more_args` too (the spread's
/// layout, say).
pub fn pairs_at_with(
    config: &BenchConfig,
    pets: usize,
    sides: Sides,
    more_args: &[String],
    progress: &dyn Fn(&str),
) -> Result<Vec<SideBySide>> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if cores < 2 {
        return Err(protocol("side-by-side pairs need two cores"));
    }
    let [first_side, second_side] = sides.runs();
    let mut pairs = Vec::new();
    for pair in 1..=config.pairs {
        let first_cpu = (pair - 1) % 2;
        // Which side starts first, and is told to go first, alternates too:
        // a floor beside a floor favoured the one started first by up to
        // 2.6%.
        let second_starts = pair % 2 == 0;
        let (mut first, mut second) = if second_starts {
            let second = Runner::start(config, second_side, pets, 1 - first_cpu, more_args)?;
            (
                Runner::start(config, first_side, pets, first_cpu, more_args)?,
                second,
            )
        } else {
            let first = Runner::start(config, first_side, pets, first_cpu, more_args)?;
            (
                first,
                Runner::start(config, second_side, pets, 1 - first_cpu, more_args)?,
            )
        };
        first.ready()?;
        second.ready()?;
        let swapper = Swapper::start(first.child.id(), second.child.id(), first_cpu);
        if second_starts {
            second.go()?;
            first.go()?;
        } else {
            first.go()?;
            second.go()?;
        }
        let first_result = first.result();
        let second_result = second.result();
        swapper.stop();
        let result = SideBySide {
            first: first_result?,
            second: second_result?,
            first_cpu,
        };
        progress(&describe(pets, pair, sides, &result));
        pairs.push(result);
    }
    Ok(pairs)
}

fn describe(pets: usize, pair: usize, sides: Sides, result: &SideBySide) -> String {
    let [a, b] = sides.runs();
    let per_pet = |seconds: f64| per_pet(seconds, pets);
    // The benchmark process creates the Pets and watches them; in the
    // floor it is the baseline client too.
    let own = |side: Side, r: &SideResult| match side {
        Side::Floor => format!(
            "benchmark with the floor's client {:.3} and webhook {:.3}",
            per_pet(r.cpu.bench),
            per_pet(r.cpu.operator)
        ),
        Side::Operator => format!(
            "benchmark {:.3}, operator {:.3} and store {:.3}",
            per_pet(r.cpu.bench),
            per_pet(r.cpu.operator),
            per_pet(r.cpu.store)
        ),
    };
    format!(
        "N = {pets}, pair {pair} side by side ({} started on CPU {}, {} on CPU {}): {} ÷ {} {:.3} ({:.2} s against {:.2} s); CPU ms per Pet: total {:.2} against {:.2}, API server {:.2} against {:.2}, {} against {}; webhook calls {} against {}",
        a.name(),
        result.first_cpu,
        b.name(),
        1 - result.first_cpu,
        b.name(),
        a.name(),
        result.ratio(),
        result.second.time.as_secs_f64(),
        result.first.time.as_secs_f64(),
        per_pet(result.second.cpu.total()),
        per_pet(result.first.cpu.total()),
        per_pet(result.second.cpu.api_server),
        per_pet(result.first.cpu.api_server),
        own(b, &result.second),
        own(a, &result.first),
        result.second.conversions,
        result.first.conversions,
    )
}

fn protocol(message: &str) -> Error {
    Error::Command {
        command: "petstore-bench (side by side)".into(),
        status: "failed".into(),
        stderr: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn affinity(pid: u32) -> Vec<usize> {
        // SAFETY: sched_getaffinity writes only the set passed to it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(
                    pid as libc::pid_t,
                    std::mem::size_of::<libc::cpu_set_t>(),
                    &mut set
                ),
                0
            );
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
                .collect()
        }
    }

    #[test]
    fn a_tree_moves_to_one_core_with_its_children() {
        // A shell whose child sleeps: the tree is two processes deep.
        let mut shell = Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .expect("sh");
        let root = shell.id();
        let started = std::time::Instant::now();
        let tree = loop {
            let tree = process_tree(root, &parents());
            if tree.len() >= 2 || started.elapsed() > Duration::from_secs(5) {
                break tree;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(tree[0], root);
        assert!(tree.len() >= 2, "the sleep below the shell: {tree:?}");
        let last_cpu = std::thread::available_parallelism().map_or(1, usize::from) - 1;
        move_tree(root, last_cpu, &parents());
        for pid in &tree {
            assert_eq!(affinity(*pid), [last_cpu], "process {pid}");
        }
        let _ = shell.kill();
        let _ = shell.wait();
    }

    #[test]
    fn the_ratio_is_the_second_run_over_the_first() {
        let run = |secs: f64| SideResult {
            time: Duration::from_secs_f64(secs),
            ..SideResult::default()
        };
        let pair = SideBySide {
            first: run(10.0),
            second: run(10.5),
            first_cpu: 0,
        };
        assert!((pair.ratio() - 1.05).abs() < 1e-9);
        assert_eq!(Side::from_name("floor"), Some(Side::Floor));
        assert_eq!(Side::from_name(Side::Operator.name()), Some(Side::Operator));
        assert_eq!(Side::from_name("both"), None);
        assert_eq!(Sides::Floors.runs(), [Side::Floor, Side::Floor]);
    }
}
