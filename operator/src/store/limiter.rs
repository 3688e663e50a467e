//! How many calls one store gets at once, and how fast: a limit that
//! adapts to the store's answers (AIMD, as TCP), under the hard bounds of
//! `--store-qps` and `--store-concurrency-max`.
//!
//! - **Concurrency.** Calls in flight are bounded by a limit that starts at
//!   [`INITIAL_LIMIT`]. It grows by one for every `limit` answers that came
//!   while it was in use, and is cut when the store says it is overloaded:
//!   halved on `RESOURCE_EXHAUSTED` or `DEADLINE_EXCEEDED`, by a tenth when
//!   an answer took more than [`LATENCY_TOLERANCE`] times the fastest recent
//!   answer of its method (plus [`LATENCY_SLACK`], a loaded machine's
//!   scheduling noise). One cut per round trip: the answers to calls sent
//!   before a cut do not cut again.
//! - **Rate.** A store that refuses by rate (`--max-calls-per-second`)
//!   refuses calls that any concurrency would send too fast when its
//!   answers are quick. So a `RESOURCE_EXHAUSTED` also caps the rate at
//!   nine tenths of what the store answered in the last second (or of the
//!   cap in force, if lower); the cap then grows by [`RATE_GROWTH`] a
//!   second while calls wait on it, and goes once it is above the hard
//!   bound or unused for [`RATE_CAP_IDLE`].
//! - **Push-back.** A refusal's `grpc-retry-pushback-ms` holds every new
//!   call to the store for that long (at most [`MAX_PAUSE`]).
//!
//! The limiter holds a few numbers per store, and the times of at most
//! [`MAX_COUNTED`] answers, whatever the load: callers
//! wait in their own futures, and there are at most as many as reconciles
//! run at once (`--concurrency`) plus the feeds' re-reads.
//!
//! `--store-concurrency N` fixes the limit at N instead and learns nothing
//! (no cut, cap or pause), as the operator was before: the measure the
//! adaptive limit is judged against.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tonic::Code;

use super::Operation;
use super::budget::CallBudget;

/// The limit a store starts at.
pub const INITIAL_LIMIT: f64 = 8.0;
/// The adaptive limit's default hard bound (`--store-concurrency-max`).
pub const DEFAULT_MAX_LIMIT: u32 = 128;
/// An answer slower than this many times its method's fastest recent one
/// (plus the slack) says the store queues.
pub const LATENCY_TOLERANCE: f64 = 3.0;
/// Scheduling noise on a loaded machine, not the store's queue.
pub const LATENCY_SLACK: Duration = Duration::from_millis(50);
/// How fast a rate cap grows while calls wait on it: a share of itself a
/// second. Slow enough that at 200 calls a second a cut to nine tenths
/// is followed by about 5 s (1,000 calls) before the next refusal.
pub const RATE_GROWTH: f64 = 0.02;
/// A rate cap no call waited on for this long goes: the store's bound may
/// have changed, and a cap that no longer binds would only slow a later
/// burst.
pub const RATE_CAP_IDLE: Duration = Duration::from_secs(60);
/// The longest a push-back holds the store's calls.
pub const MAX_PAUSE: Duration = Duration::from_secs(1);
/// The lowest rate cap: a store that refuses everything still hears from
/// the operator.
const MIN_RATE: f64 = 1.0;
/// How far back the answered rate is counted.
const RATE_WINDOW: Duration = Duration::from_secs(1);
/// The most answers remembered for the rate: its memory is bounded
/// whatever the store answers (a rate above this a second reads as this).
const MAX_COUNTED: usize = 10_000;
/// The shortest span the answered rate is counted over, so the first
/// answers after a start are not read as a rate of thousands.
const MIN_RATE_SPAN: Duration = Duration::from_millis(100);

/// How the limit of calls at once is set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ConcurrencyLimit {
    /// Adapts to the store's answers, up to `max`.
    Adaptive { max: u32 },
    /// Fixed: never adapts.
    Fixed(u32),
}

impl Default for ConcurrencyLimit {
    fn default() -> Self {
        Self::Adaptive {
            max: DEFAULT_MAX_LIMIT,
        }
    }
}

/// The limits of one store's calls, shared by every client of its channel.
pub struct StoreLimiter {
    /// The hard rate bound, `--store-qps`.
    budget: CallBudget,
    state: Mutex<Limits>,
    freed: Notify,
    /// One caller at a time asks the limits, in the order they came (tokio's
    /// semaphore is first come, first served, and a caller that gives up
    /// hands its turn on). Without it, callers woken at once raced for each
    /// token, and some reconciles waited minutes while newer calls went.
    turn: tokio::sync::Semaphore,
    shown: Option<Box<dyn ShowLimits>>,
}

/// Where a limiter shows its limits (the operator's metrics), told after
/// every answer.
pub trait ShowLimits: Send + Sync {
    /// The limit of calls at once, and the rate cap (`None`: uncapped).
    fn show(&self, limit: f64, rate_cap: Option<f64>);
}

/// What a call is told when it asks to go.
#[derive(Debug, PartialEq)]
enum Admit {
    /// Go: the cut epoch it went in.
    Go(u64),
    /// Ask again at this instant (a push-back or the rate cap).
    At(Instant),
    /// Ask again once a call ends.
    Full,
}

/// The limiter's numbers: pure, so the rules are tested without a clock.
#[derive(Debug)]
pub struct Limits {
    mode: ConcurrencyLimit,
    limit: f64,
    in_flight: u32,
    /// Bumped by each cut; an answer to a call sent before it cuts no more.
    epoch: u64,
    /// The fastest recent answer of each method, in seconds.
    fastest: HashMap<Operation, f64>,
    rate_cap: Option<RateCap>,
    paused_until: Option<Instant>,
    /// When the OK answers of the last [`RATE_WINDOW`] came.
    answered: std::collections::VecDeque<Instant>,
    /// The hard bound the rate cap goes at, `--store-qps` (0: none).
    hard_rate: f64,
}

#[derive(Debug)]
struct RateCap {
    rate: f64,
    tokens: f64,
    refilled: Instant,
    /// The last call to ask found no token.
    waited_on: bool,
    /// When a call last waited on the cap.
    last_waited: Instant,
}

/// How the store answered a call, as the limiter reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Answer {
    pub code: Code,
    pub took: Duration,
    pub pushback: Option<Duration>,
}

impl Limits {
    pub fn new(mode: ConcurrencyLimit, hard_rate: f64) -> Self {
        let limit = match mode {
            ConcurrencyLimit::Adaptive { max } => INITIAL_LIMIT.min(f64::from(max.max(1))),
            ConcurrencyLimit::Fixed(n) => f64::from(n.max(1)),
        };
        Self {
            mode,
            limit,
            in_flight: 0,
            epoch: 0,
            fastest: HashMap::new(),
            rate_cap: None,
            paused_until: None,
            answered: std::collections::VecDeque::new(),
            hard_rate,
        }
    }

    /// The limit of calls at once now.
    pub fn limit(&self) -> f64 {
        self.limit
    }

    /// The rate cap now, if the store has refused by rate.
    pub fn rate_cap(&self) -> Option<f64> {
        self.rate_cap.as_ref().map(|cap| cap.rate)
    }

    fn admit(&mut self, now: Instant) -> Admit {
        if let Some(until) = self.paused_until {
            if now < until {
                return Admit::At(until);
            }
            self.paused_until = None;
        }
        if f64::from(self.in_flight) + 1.0 > self.limit.floor().max(1.0) {
            return Admit::Full;
        }
        if self
            .rate_cap
            .as_ref()
            .is_some_and(|cap| now.saturating_duration_since(cap.last_waited) > RATE_CAP_IDLE)
        {
            self.rate_cap = None;
        }
        if let Some(cap) = &mut self.rate_cap {
            let elapsed = now.saturating_duration_since(cap.refilled).as_secs_f64();
            // Time a call spent waiting on the cap: it is in use, so it
            // may grow.
            if cap.waited_on {
                cap.rate *= 1.0 + RATE_GROWTH * elapsed;
            }
            let burst = (cap.rate / 10.0).max(1.0);
            cap.tokens = (cap.tokens + elapsed * cap.rate).min(burst);
            cap.refilled = cap.refilled.max(now);
            cap.waited_on = cap.tokens < 1.0;
            if cap.waited_on {
                cap.last_waited = now;
                let wait = (1.0 - cap.tokens) / cap.rate;
                return Admit::At(now + Duration::from_secs_f64(wait));
            }
            cap.tokens -= 1.0;
        }
        if self.hard_rate > 0.0 && self.rate_cap().is_some_and(|rate| rate >= self.hard_rate) {
            self.rate_cap = None;
        }
        self.in_flight += 1;
        Admit::Go(self.epoch)
    }

    /// A call sent in `epoch` ended with `answer` (or, `None`, was dropped
    /// unanswered). Returns whether the limit rose to a new whole number.
    fn answered(
        &mut self,
        epoch: u64,
        operation: Operation,
        answer: Option<Answer>,
        now: Instant,
    ) -> bool {
        let busy = f64::from(self.in_flight) >= self.limit.floor() / 2.0;
        self.in_flight = self.in_flight.saturating_sub(1);
        // A fixed limit is as before: nothing learnt, no pause, no cap.
        let (Some(answer), ConcurrencyLimit::Adaptive { .. }) = (answer, self.mode) else {
            return false;
        };
        if let Some(pushback) = answer.pushback {
            let until = now + pushback.min(MAX_PAUSE);
            self.paused_until = Some(self.paused_until.map_or(until, |at| at.max(until)));
        }
        let before = self.limit.floor();
        match answer.code {
            Code::ResourceExhausted => {
                if epoch == self.epoch {
                    self.cut(0.5);
                    // Never above a cap it already had: that one was too
                    // high as well.
                    let answered = self.answered_rate(now);
                    let held = self.rate_cap().map_or(answered, |cap| cap.min(answered));
                    self.rate_cap = Some(RateCap {
                        rate: (held * 0.9).max(MIN_RATE),
                        tokens: 0.0,
                        refilled: now,
                        waited_on: false,
                        last_waited: now,
                    });
                }
            }
            Code::DeadlineExceeded => {
                if epoch == self.epoch {
                    self.cut(0.5);
                }
            }
            // The store did not answer: its health is the backoff's and
            // the probe's business, not a measure of its queue.
            Code::Unavailable | Code::Cancelled | Code::Unknown | Code::Internal => {}
            _ => {
                self.note_answered(now);
                let took = answer.took.as_secs_f64();
                let fastest = self.fastest.entry(operation).or_insert(took);
                let queued = took > *fastest * LATENCY_TOLERANCE + LATENCY_SLACK.as_secs_f64();
                // The fastest drifts up slowly, so a store that became
                // slower for good is not read as queueing forever.
                *fastest = if took < *fastest {
                    took
                } else {
                    *fastest + (took - *fastest) * 0.01
                };
                if queued {
                    if epoch == self.epoch {
                        self.cut(0.9);
                    }
                } else if busy {
                    self.grow();
                }
            }
        }
        self.limit.floor() > before
    }

    fn cut(&mut self, by: f64) {
        self.limit = (self.limit * by).max(1.0);
        self.epoch += 1;
    }

    fn grow(&mut self) {
        if let ConcurrencyLimit::Adaptive { max } = self.mode {
            self.limit = (self.limit + 1.0 / self.limit).min(f64::from(max.max(1)));
        }
    }

    fn note_answered(&mut self, now: Instant) {
        if self.answered.len() >= MAX_COUNTED {
            self.answered.pop_front();
        }
        self.answered.push_back(now);
        self.forget_answers_before(now);
    }

    fn forget_answers_before(&mut self, now: Instant) {
        while self
            .answered
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) > RATE_WINDOW)
        {
            self.answered.pop_front();
        }
    }

    /// OK answers a second, over the last [`RATE_WINDOW`] (or since the
    /// first of them, if later, but at least [`MIN_RATE_SPAN`]).
    fn answered_rate(&mut self, now: Instant) -> f64 {
        self.forget_answers_before(now);
        let Some(oldest) = self.answered.front() else {
            return 0.0;
        };
        let span = now
            .saturating_duration_since(*oldest)
            .clamp(MIN_RATE_SPAN, RATE_WINDOW);
        self.answered.len() as f64 / span.as_secs_f64()
    }
}

impl StoreLimiter {
    /// `mode` for calls at once; at most `qps` calls a second (0: no
    /// bound) and `burst` at once above it.
    pub fn new(mode: ConcurrencyLimit, qps: f64, burst: u32) -> Self {
        Self {
            budget: CallBudget::new(qps, burst),
            state: Mutex::new(Limits::new(mode, qps)),
            freed: Notify::new(),
            turn: tokio::sync::Semaphore::new(1),
            shown: None,
        }
    }

    /// Shows the limits in `shown`, from now on.
    #[must_use]
    pub fn showing_in(mut self, shown: Box<dyn ShowLimits>) -> Self {
        let (limit, rate_cap) = self.current();
        shown.show(limit, rate_cap);
        self.shown = Some(shown);
        self
    }

    /// No bound at all (tests, and clients whose calls are few).
    pub fn unlimited() -> Self {
        Self::new(ConcurrencyLimit::Fixed(u32::MAX), 0.0, 1)
    }

    fn limits(&self) -> std::sync::MutexGuard<'_, Limits> {
        // Plain numbers inside; a panic elsewhere cannot corrupt them.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The limit of calls at once, and the rate cap if any.
    pub fn current(&self) -> (f64, Option<f64>) {
        let limits = self.limits();
        (limits.limit(), limits.rate_cap())
    }

    /// Waits until a call to `operation` may go; the permit it returns is
    /// told how the call ended.
    pub async fn acquire(self: &Arc<Self>, operation: Operation) -> Permit {
        self.budget.acquire().await;
        // Never closed; were it, the caller would go without a turn.
        let _turn = self.turn.acquire().await.ok();
        loop {
            // Made before the check, so a call ending in between wakes it.
            let freed = self.freed.notified();
            let admit = self.limits().admit(now());
            match admit {
                Admit::Go(epoch) => {
                    return Permit {
                        limiter: Arc::clone(self),
                        operation,
                        epoch,
                        done: false,
                    };
                }
                Admit::At(at) => tokio::time::sleep_until(at.into()).await,
                Admit::Full => freed.await,
            }
        }
    }

    fn release(&self, epoch: u64, operation: Operation, answer: Option<Answer>) {
        let (grew, limit, rate_cap) = {
            let mut limits = self.limits();
            let grew = limits.answered(epoch, operation, answer, now());
            (grew, limits.limit(), limits.rate_cap())
        };
        if let Some(shown) = &self.shown {
            shown.show(limit, rate_cap);
        }
        self.freed.notify_one();
        if grew {
            self.freed.notify_one();
        }
    }
}

/// Now, by tokio's clock (the same as std's, unless a test pauses it).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// A call's place in its store's limit, given back when it ends.
pub struct Permit {
    limiter: Arc<StoreLimiter>,
    operation: Operation,
    epoch: u64,
    done: bool,
}

impl Permit {
    /// The call ended with `answer`.
    pub fn answered(mut self, answer: Answer) {
        self.done = true;
        self.limiter
            .release(self.epoch, self.operation, Some(answer));
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.done {
            self.limiter.release(self.epoch, self.operation, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer with `code` after `took`, with no pushback.
    fn answer(code: Code, took: Duration) -> Answer {
        Answer {
            code,
            took,
            pushback: None,
        }
    }

    fn ok(ms: u64) -> Option<Answer> {
        Some(answer(Code::Ok, Duration::from_millis(ms)))
    }

    fn refused(pushback_ms: Option<u64>) -> Option<Answer> {
        Some(Answer {
            pushback: pushback_ms.map(Duration::from_millis),
            ..answer(Code::ResourceExhausted, Duration::from_millis(1))
        })
    }

    /// One call sent at `at`, under the limit, and answered at once.
    fn call(limits: &mut Limits, at: Instant, answer: Option<Answer>) {
        let Admit::Go(epoch) = limits.admit(at) else {
            panic!("the limit is full at {at:?}");
        };
        limits.answered(epoch, Operation::Observe, answer, at);
    }

    /// Sends calls until the limit is full; returns their epochs.
    fn fill(limits: &mut Limits, now: Instant) -> Vec<u64> {
        let mut sent = Vec::new();
        while let Admit::Go(epoch) = limits.admit(now) {
            sent.push(epoch);
        }
        sent
    }

    #[test]
    fn the_limit_grows_by_one_a_round_of_quick_answers_up_to_its_bound() {
        let mut limits = Limits::new(ConcurrencyLimit::Adaptive { max: 12 }, 0.0);
        let now = Instant::now();
        assert_eq!(fill(&mut limits, now).len(), 8, "starts at 8");
        assert_eq!(limits.admit(now), Admit::Full);
        // A round: eight quick answers while the limit is used.
        for _ in 0..8 {
            limits.answered(0, Operation::Observe, ok(1), now);
            let _ = limits.admit(now);
        }
        // 1/limit an answer: about one a round.
        assert!((8.9..=9.0).contains(&limits.limit()), "{}", limits.limit());
        for _ in 0..1_000 {
            limits.answered(0, Operation::Observe, ok(1), now);
            let _ = limits.admit(now);
        }
        assert_eq!(limits.limit(), 12.0, "capped at its bound");
    }

    #[test]
    fn an_idle_limit_does_not_grow() {
        let mut limits = Limits::new(ConcurrencyLimit::default(), 0.0);
        let now = Instant::now();
        for _ in 0..1_000 {
            call(&mut limits, now, ok(1));
        }
        assert_eq!(limits.limit(), INITIAL_LIMIT);
    }

    #[test]
    fn a_refusal_halves_the_limit_once_a_round_and_caps_the_rate() {
        let mut limits = Limits::new(ConcurrencyLimit::default(), 5000.0);
        let start = Instant::now();
        // 100 answers in the last second, then the store refuses.
        for i in 0..100 {
            let at = start + Duration::from_millis(10 * i);
            call(&mut limits, at, ok(1));
        }
        let now = start + Duration::from_secs(1);
        let sent = fill(&mut limits, now);
        assert_eq!(sent.len(), 8);
        // Every call of the round is refused: one cut, not eight.
        for epoch in sent {
            limits.answered(epoch, Operation::Observe, refused(None), now);
        }
        assert_eq!(limits.limit(), 4.0);
        let cap = limits.rate_cap().expect("a rate cap");
        assert!((cap - 90.0).abs() < 10.0, "nine tenths of ~100/s: {cap}");
        // Calls now wait on the cap.
        assert!(matches!(limits.admit(now), Admit::At(_)));
    }

    #[test]
    fn a_second_refusal_lowers_the_cap_even_when_more_was_answered() {
        let mut limits = Limits::new(ConcurrencyLimit::default(), 5000.0);
        let start = Instant::now();
        call(&mut limits, start, refused(None));
        assert_eq!(limits.rate_cap(), Some(MIN_RATE), "nothing answered yet");
        // The cap is waited on for a second (20 calls at 20 a second would
        // be answered), then refused again: the cap goes down, not up.
        let later = start + Duration::from_secs(1);
        for i in 0..20 {
            limits.note_answered(start + Duration::from_millis(50 * i));
        }
        let Admit::Go(epoch) = limits.admit(later) else {
            panic!("a token by then");
        };
        limits.answered(epoch, Operation::Observe, refused(None), later);
        let cap = limits.rate_cap().expect("still capped");
        assert!(cap <= MIN_RATE, "{cap}");
    }

    #[test]
    fn a_timeout_halves_the_limit_and_caps_no_rate() {
        let mut limits = Limits::new(ConcurrencyLimit::default(), 0.0);
        let now = Instant::now();
        let sent = fill(&mut limits, now);
        let timed_out = answer(Code::DeadlineExceeded, Duration::from_secs(5));
        limits.answered(sent[0], Operation::Update, Some(timed_out), now);
        assert_eq!(limits.limit(), INITIAL_LIMIT / 2.0);
        assert_eq!(limits.rate_cap(), None);
    }

    #[test]
    fn a_slow_answer_cuts_by_a_tenth_and_a_fast_one_does_not() {
        let mut limits = Limits::new(ConcurrencyLimit::default(), 0.0);
        let now = Instant::now();
        let sent = fill(&mut limits, now);
        // Fastest AddPets 10 ms; 75 ms is within 3 x 10 + 50 ms.
        limits.answered(sent[0], Operation::Create, ok(10), now);
        limits.answered(sent[1], Operation::Create, ok(75), now);
        assert!(limits.limit() >= INITIAL_LIMIT, "{}", limits.limit());
        // A GetPets is judged by its own method's fastest, not AddPets'.
        limits.answered(sent[2], Operation::Observe, ok(1), now);
        let before = limits.limit();
        limits.answered(sent[3], Operation::Create, ok(200), now);
        assert!(
            (limits.limit() - before * 0.9).abs() < 1e-9,
            "{}",
            limits.limit()
        );
        // Another slow answer of the same round cuts no more.
        limits.answered(sent[4], Operation::Create, ok(200), now);
        assert!((limits.limit() - before * 0.9).abs() < 1e-9);
        // 75 ms is slow for a GetPets, whose fastest was 1 ms.
        let next_round = fill(&mut limits, now);
        let before = limits.limit();
        limits.answered(next_round[0], Operation::Observe, ok(75), now);
        assert!(
            (limits.limit() - before * 0.9).abs() < 1e-9,
            "{}",
            limits.limit()
        );
    }

    #[test]
    fn a_pushback_holds_every_call_for_its_time_at_most_a_second() {
        let mut limits = Limits::new(ConcurrencyLimit::default(), 0.0);
        let now = Instant::now();
        call(&mut limits, now, refused(Some(60_000)));
        assert_eq!(limits.admit(now), Admit::At(now + MAX_PAUSE));
        // Past the pause, the cap (nothing answered yet: its floor) governs.
        let later = now + MAX_PAUSE + Duration::from_secs(2);
        assert!(matches!(limits.admit(later), Admit::Go(_)));
    }

    #[test]
    fn the_rate_cap_grows_while_used_and_goes_above_the_hard_bound() {
        let mut limits = Limits::new(ConcurrencyLimit::default(), 50.0);
        let now = Instant::now();
        call(&mut limits, now, refused(None));
        let mut at = now;
        let mut went = 0;
        while limits.rate_cap().is_some() && went < 100_000 {
            match limits.admit(at) {
                Admit::Go(epoch) => {
                    went += 1;
                    limits.answered(epoch, Operation::Observe, ok(1), at);
                }
                Admit::At(next) => at = next,
                Admit::Full => panic!("one at a time"),
            }
        }
        assert!(
            limits.rate_cap().is_none(),
            "the cap went above 50/s and went"
        );
        let took = at.duration_since(now).as_secs_f64();
        // From 1/s at 2% a second: ln(50) / 0.02, about 196 s.
        assert!((170.0..220.0).contains(&took), "{took}");
    }

    #[test]
    fn a_rate_cap_unused_for_a_minute_goes() {
        let mut limits = Limits::new(ConcurrencyLimit::default(), 5000.0);
        let now = Instant::now();
        call(&mut limits, now, refused(None));
        assert!(
            matches!(limits.admit(now), Admit::At(_)),
            "waits on the cap"
        );
        let later = now + RATE_CAP_IDLE + Duration::from_secs(1);
        assert!(matches!(limits.admit(later), Admit::Go(_)));
        assert_eq!(limits.rate_cap(), None);
    }

    #[test]
    fn the_first_answers_after_a_start_are_not_read_as_a_high_rate() {
        let mut limits = Limits::new(ConcurrencyLimit::default(), 5000.0);
        let start = Instant::now();
        // 20 answers within 10 ms (a store's burst), then a refusal.
        for i in 0..20 {
            let at = start + Duration::from_micros(500 * i);
            call(&mut limits, at, ok(0));
        }
        let now = start + Duration::from_millis(10);
        call(&mut limits, now, refused(None));
        // Counted over 100 ms, not 10: 200/s, capped at 180.
        let cap = limits.rate_cap().expect("a cap");
        assert!((cap - 180.0).abs() < 1e-6, "{cap}");
    }

    #[test]
    fn a_fixed_limit_never_moves_caps_or_pauses() {
        let mut limits = Limits::new(ConcurrencyLimit::Fixed(16), 0.0);
        let now = Instant::now();
        let sent = fill(&mut limits, now);
        assert_eq!(sent.len(), 16);
        for epoch in sent {
            limits.answered(epoch, Operation::Observe, refused(Some(500)), now);
        }
        assert_eq!(limits.limit(), 16.0);
        assert_eq!(limits.rate_cap(), None);
        assert_eq!(fill(&mut limits, now).len(), 16, "no pause");
    }

    #[test]
    fn an_unanswered_call_gives_its_place_back_and_teaches_nothing() {
        let mut limits = Limits::new(ConcurrencyLimit::default(), 0.0);
        let now = Instant::now();
        let sent = fill(&mut limits, now);
        limits.answered(sent[0], Operation::Observe, None, now);
        let unavailable = answer(Code::Unavailable, Duration::from_secs(5));
        limits.answered(sent[1], Operation::Observe, Some(unavailable), now);
        assert_eq!(limits.limit(), INITIAL_LIMIT);
        assert_eq!(fill(&mut limits, now).len(), 2);
    }

    /// A caller that comes just as the next token does must not take it
    /// from one that has waited for it.
    #[tokio::test(start_paused = true)]
    async fn a_newcomer_never_overtakes_a_caller_waiting_on_the_rate() {
        let limiter = Arc::new(StoreLimiter::new(ConcurrencyLimit::default(), 0.0, 1));
        limiter
            .acquire(Operation::Observe)
            .await
            .answered(answer(Code::ResourceExhausted, Duration::from_millis(1)));
        let (went, mut order) = tokio::sync::mpsc::unbounded_channel();
        let call = |who: &'static str, after: Duration| {
            let (limiter, went) = (Arc::clone(&limiter), went.clone());
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let permit = limiter.acquire(Operation::Observe).await;
                let _ = went.send(who);
                permit.answered(answer(Code::Ok, Duration::from_millis(1)));
            })
        };
        // Its timer set first, the newcomer comes at the very moment the
        // token does; the waiter asked a second before.
        let newcomer = call("newcomer", Duration::from_secs(1));
        tokio::task::yield_now().await;
        let waiter = call("waiter", Duration::ZERO);
        let _ = tokio::join!(newcomer, waiter);
        drop(went);
        let mut seen = Vec::new();
        while let Some(who) = order.recv().await {
            seen.push(who);
        }
        assert_eq!(seen, ["waiter", "newcomer"]);
    }

    #[tokio::test]
    async fn a_waiting_call_goes_when_another_ends() {
        let limiter = Arc::new(StoreLimiter::new(ConcurrencyLimit::Fixed(1), 0.0, 1));
        let first = limiter.acquire(Operation::Observe).await;
        let waiting = tokio::spawn({
            let limiter = Arc::clone(&limiter);
            async move { limiter.acquire(Operation::Observe).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("woken when the first ended")
            .expect("the task");
        second.answered(answer(Code::Ok, Duration::from_millis(1)));
        assert_eq!(limiter.limits().in_flight, 0);
    }
}
