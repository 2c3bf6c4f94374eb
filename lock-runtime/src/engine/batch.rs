//! The acquires and releases of one service share script calls when they fall due together.
//!
//! An operation that finds no call on its way is sent at once by its own caller, so a lone
//! caller pays nothing for batching; so is a release that hands the lock to a waiter of this
//! service (which that waiter waits for) while a slot is free (fewer than `IN_FLIGHT` calls on
//! their way; on a multi-thread runtime such releases have `HAND_OFF_SLOTS` more). Any other
//! operation queues: when a slot is free, it takes it for the queue and a task of the service
//! sends the queued operations in it once the tasks that are ready now have run (each with its
//! next operation, typically the callers a call that came back just answered); else a call
//! that comes back sends them, after the callers it answered have run. Slots about to send
//! share the queue (up to [`MAX_OPS`] operations each), and a few operations wait for a call
//! of many more that is on its way rather than take a call of their own beside it: the calls
//! on their way stay about the same size, and Redis runs one while the client reads another.
//! Under load many callers share one round trip and one script run, in which Redis runs their
//! operations in order, each as it would run alone (`ops.lua`): throughput grows with the load
//! instead of being capped by the per-request cost of Redis and of the client.
//!
//! One call runs the operations of one kind (the kind's script); queued operations of another
//! kind go with the next call. No call carries more than [`MAX_OPS`] operations: a longer run
//! (a multi-key lock's keys) goes out as several calls, one after another, so other clients of
//! Redis wait for one short script at most. In cluster mode operations on different slots
//! cannot share a script call: each is sent alone.

use std::sync::Arc;
use std::time::Instant;

use redis::Value;

use super::batcher::{MAX_OPS, Op, OpReply, Waiting};
use super::core::Engine;
use super::reply::Ask;
use crate::backend::Synced;
use crate::error::{ErrorKind, LockError};
use crate::scripts::{QUEUE_SUFFIX, ScriptCall};

/// A taken slot; dropping it sends the queued operations or frees the slot, also when the call
/// that held it was cancelled or panicked. `ops`: the operations of its call (none for a
/// collector's slot, which sent nothing yet).
struct Slot<'a> {
    inner: &'a Arc<Engine>,
    ops: usize,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let timeout = self.inner.config.response_timeout();
        let next = self.inner.batcher.next_batch(timeout, self.ops);
        for late in next.late {
            // (its caller may have gone: then nobody waits for the error)
            let _ = late.reply.send(Err(queued_too_long(timeout)));
        }
        let Some((batch, deadline)) = next.batch else {
            return;
        };
        // The slot passes to the task (with it also when the task is dropped unpolled).
        let slot = OwnedSlot {
            inner: self.inner.clone(),
            ops: batch.len(),
        };
        self.inner.runtime.spawn(async move {
            let inner = slot.inner.clone();
            let (ops, senders): (Vec<Op>, Vec<_>) = batch
                .into_iter()
                .map(|queued| (queued.op, queued.reply))
                .unzip();
            let replies = inner.send_ops_until(&ops, Some(deadline)).await;
            for ((reply, sender), op) in replies.into_iter().zip(senders).zip(&ops) {
                if sender.send(reply).is_err() {
                    // Only when the runtime shuts down: the lease bounds what is left.
                    tracing::debug!(key = %op.names().user, "lock operation reply dropped");
                }
            }
            // The callers just answered are ready to run, most with their next operation: the
            // slot goes on with those (it frees only after them), so that none of them finds a
            // slot free with no call on its way and takes it for itself alone.
            tokio::task::yield_now().await;
            drop(slot);
        });
    }
}

/// A [`Slot`] a task of the service holds: a call's sender, or a collector (see
/// [`Engine::collect_queued`]); dropped with the task also when it is dropped unpolled.
struct OwnedSlot {
    inner: Arc<Engine>,
    ops: usize,
}

impl Drop for OwnedSlot {
    fn drop(&mut self) {
        drop(Slot {
            inner: &self.inner,
            ops: self.ops,
        });
    }
}

/// The failure of a queued operation that waited `timeout` (`response_timeout`) without going
/// out: the calls before it did not come back in time.
fn queued_too_long(timeout: std::time::Duration) -> LockError {
    LockError::new(
        ErrorKind::Backend,
        format!(
            "redis did not answer within {timeout:?} (redis.response_timeout): the calls \
             before this one were still on their way"
        ),
    )
}

impl Engine {
    /// Runs one operation on Redis: at once when a slot is free, else with the next call.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own (a grant could be lost): callers run it inside a
    /// [`Detachable`](crate::detach::Detachable) or a task of their own.
    ///
    /// The slot is taken (or the operation queued) when this is called, not when the future
    /// is first polled; the future holds the operation once (an `async fn` would hold it twice,
    /// as its argument and as what it sends, and every lock operation's future carries this
    /// one).
    pub(crate) fn run_op(
        self: &Arc<Self>,
        op: Op,
    ) -> impl std::future::Future<Output = OpReply> + Send + '_ {
        let mut taken = self.take_slot_or_queue(op);
        // (built only when a slot was taken: dropping a Slot frees one, also when this future
        // is dropped before it is polled)
        let slot = (taken.is_ok() && !self.backend.is_cluster()).then(|| Slot {
            inner: self,
            ops: 1,
        });
        if matches!(&taken, Err(waiting) if waiting.collect) {
            self.collect_queued();
        }
        async move {
            let _slot = slot;
            let op = match &mut taken {
                Ok(op) => &*op,
                Err(Waiting { reply, .. }) => {
                    // `response_timeout` bounds the operation from when it was asked for,
                    // also while it waits for a call to go out with: the slot that sends it
                    // fails it instead once it waited that long, and its call answers by then
                    // (see `Batcher::next_batch`: no timer per operation). A queued operation
                    // whose caller gave up is not sent at all; one already sent is given back
                    // by its caller, like any operation whose reply did not come.
                    return reply.await.unwrap_or_else(|_| {
                        Err(LockError::new(
                            ErrorKind::Backend,
                            "the lock service stopped before Redis answered",
                        ))
                    });
                }
            };
            let ops = std::slice::from_ref(op);
            // boxed: under load most operations queue, and their futures (a lock call's, a
            // release's) then carry the queued branch's size, not a call's
            let mut replies = Box::pin(self.send_chunk(ops, None)).await;
            replies
                .pop()
                .unwrap_or_else(|| Err(bad_batch(ops, "no reply")))
        }
    }

    /// Takes a slot and gives `op` back to be sent now, or queues it (see
    /// [`Batcher::take_or_queue`]).
    fn take_slot_or_queue(&self, op: Op) -> Result<Op, Waiting> {
        if self.backend.is_cluster() {
            return Ok(op);
        }
        self.batcher.take_or_queue(op)
    }

    /// Sends the queued operations in the slot an operation took for them, once the tasks
    /// that are ready now ran (and queued theirs): the task that does it runs after them.
    fn collect_queued(self: &Arc<Self>) {
        let collector = OwnedSlot {
            inner: self.clone(),
            ops: 0,
        };
        self.runtime.spawn(async move {
            tokio::task::yield_now().await;
            drop(collector);
        });
    }

    /// Runs `ops` (all of one kind) in `ops.lua` calls of at most [`MAX_OPS`] operations each,
    /// one after another, so that no call keeps Redis busy for long; one reply per operation,
    /// in order. An all-or-nothing run ([`Ask::Chained`] acquires) stops across calls as within
    /// one: once one of them is refused or fails, the calls after it are not sent and their
    /// operations reply "not run".
    pub(crate) async fn send_ops(&self, ops: &[Op]) -> Vec<OpReply> {
        self.send_ops_until(ops, None).await
    }

    /// [`send_ops`](Self::send_ops) with every call answered by `deadline` (`None`: each
    /// within `response_timeout`).
    async fn send_ops_until(&self, ops: &[Op], deadline: Option<Instant>) -> Vec<OpReply> {
        if ops.len() <= MAX_OPS {
            // one call: its replies as they are
            return self.send_chunk(ops, deadline).await;
        }
        let mut replies = Vec::with_capacity(ops.len());
        let mut stopped = false;
        for chunk in ops.chunks(MAX_OPS) {
            if stopped {
                replies.extend(chunk.iter().map(|op| Err(not_run(op))));
                continue;
            }
            let chunk_replies = self.send_chunk(chunk, deadline).await;
            stopped = chunk
                .iter()
                .zip(&chunk_replies)
                .any(|(op, reply)| op.chained() && !granted(reply));
            replies.extend(chunk_replies);
        }
        replies
    }

    /// One `ops.lua` call for `ops`, answered by `deadline` (`None`: within
    /// `response_timeout`); one reply per operation, in order.
    async fn send_chunk(&self, ops: &[Op], deadline: Option<Instant>) -> Vec<OpReply> {
        // (all of one kind)
        let Some(kind) = ops.first().map(Op::kind) else {
            return Vec::new();
        };
        crate::metrics::batch(kind.mode, ops.len());
        // in a cluster every key a script touches is declared (correct while a slot migrates);
        // on one server the lock only, and the script names the others (see `scripts::OpKeys`)
        let script = self.ops_script(kind);
        let keys = ops.len() * script.keys_per_op;
        let mut call = ScriptCall::ops(script, keys, self.backend.functions());
        for op in ops {
            let names = op.names();
            call.key(&names.lock);
            if script.declare_all {
                call.key(names.fence());
                call.key_suffixed(&names.lock, QUEUE_SUFFIX);
                if let Some(suffix) = kind.fourth_key {
                    call.key_suffixed(&names.lock, suffix);
                }
            }
        }
        call.arg(&self.service_id);
        match self.sent_arg() {
            Some(us) => call.arg(us),
            None => call.arg(""),
        };
        // per operation (see ops.lua): its code, 'grant|owner', two more, and the kind's extra
        // for a kind that has one (a release sends '' there); a plain release ('x') its code
        // and 'grant|owner' only
        for op in ops {
            match op {
                Op::Acquire {
                    target,
                    owner,
                    grant,
                    lease_ms,
                    ask,
                } => {
                    call.arg(match ask {
                        Ask::Chained => "A",
                        Ask::Grant { fresh: true, .. } => "f",
                        _ => "a",
                    })
                    .arg_joined(&[grant, "|", owner])
                    .arg(lease_ms)
                    .arg(ask.horizon_arg());
                    if kind.extra_arg {
                        call.arg(&*target.extra);
                    }
                }
                Op::Release {
                    owner,
                    grant,
                    next,
                    in_turn,
                    keep_until,
                    ..
                } => {
                    // with no next owner, the lease argument is how long to keep the lock
                    // taken (0: free it)
                    let keep = keep_until.map_or(0, |until| {
                        let left = until.saturating_duration_since(Instant::now());
                        u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
                    });
                    if next.is_none() && keep == 0 && !*in_turn {
                        // the common release: two arguments
                        call.arg("x").arg_joined(&[grant, "|", owner]);
                        continue;
                    }
                    call.arg(if *in_turn { "k" } else { "r" })
                        .arg_joined(&[grant, "|", owner]);
                    match next {
                        // grants that coexist: the release decides whether they fit
                        Some(r) if kind.shared => call
                            .arg_joined(&[&r.grant, "|", &r.owner])
                            .arg_fmt(format_args!("{} {} {}", r.lease_ms, r.held, r.extra)),
                        Some(r) => call.arg_joined(&[&r.grant, "|", &r.owner]).arg(r.lease_ms),
                        None => call.arg("").arg(keep),
                    };
                    if kind.extra_arg {
                        call.arg("");
                    }
                }
            };
        }
        let what = if ops.iter().all(|op| matches!(op, Op::Acquire { .. })) {
            "acquire"
        } else if ops.iter().all(|op| matches!(op, Op::Release { .. })) {
            "release"
        } else {
            "acquire/release"
        };
        let result = if ops.iter().any(Op::grants) {
            self.backend
                .run_synced_until::<Value>(what, &call, deadline)
                .await
        } else {
            self.backend
                .run_until::<Value>(what, &call, deadline)
                .await
                .map(|reply| Synced {
                    reply,
                    acknowledged: true,
                })
        };
        let synced = match result {
            Ok(synced) => synced,
            Err(e) => return ops.iter().map(|_| Err(e.duplicate())).collect(),
        };
        let acknowledged = synced.acknowledged;
        let with_ack = |reply: Result<[i64; 3], LockError>| {
            reply.map(|reply| Synced {
                reply,
                acknowledged,
            })
        };
        match synced.reply {
            // every operation ran: their values as decimal texts separated by spaces
            // (reply.lua)
            Value::BulkString(text) => {
                let mut values: Vec<&[u8]> = Vec::with_capacity(ops.len() * 3);
                values.extend(text.split(|b| *b == b' '));
                if values.len() != ops.len() * 3 {
                    let why = format!("{} values", values.len());
                    return ops.iter().map(|_| Err(bad_batch(ops, &why))).collect();
                }
                values
                    .chunks_exact(3)
                    .zip(ops)
                    .map(|(texts, op)| with_ack(op_reply_texts(texts, op)))
                    .collect()
            }
            Value::Array(values) if values.len() == ops.len() * 3 => values
                .chunks_exact(3)
                .zip(ops)
                .map(|(values, op)| with_ack(op_reply(values, op)))
                .collect(),
            other => {
                let why = match other {
                    Value::Array(values) => format!("{} replies", values.len()),
                    other => format!("{other:?}"),
                };
                ops.iter().map(|_| Err(bad_batch(ops, &why))).collect()
            }
        }
    }
}

/// An operation's failure: `why`, on its lock.
fn op_failed(op: &Op, why: String) -> LockError {
    let user = &op.names().user;
    LockError::new(
        ErrorKind::Backend,
        format!("redis lock operation on `{user}` failed: {why}"),
    )
    .with_key(user)
}

/// An integer written as decimal text (a token, a reply value of `reply.lua`): an optional
/// `-` and at most 18 digits (parsed from the bytes: no text check, no overflow possible).
fn decimal(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut value: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        value = value * 10 + i64::from(d - b'0');
    }
    Some(if negative { -value } else { value })
}

/// The three values of one operation in a reply of decimal texts (see `reply.lua`).
fn op_reply_texts(texts: &[&[u8]], op: &Op) -> Result<[i64; 3], LockError> {
    let mut reply = [0; 3];
    for (slot, text) in reply.iter_mut().zip(texts) {
        *slot = decimal(text).ok_or_else(|| {
            op_failed(
                op,
                format!("unexpected reply value {:?}", String::from_utf8_lossy(text)),
            )
        })?;
    }
    Ok(reply)
}

/// The three elements of the `ops.lua` reply for one operation when the reply is an array:
/// its values (integers, tokens as decimal text), or `-1, message` when it failed.
fn op_reply(values: &[Value], op: &Op) -> Result<[i64; 3], LockError> {
    if let [Value::Int(-2), ..] = values {
        return Err(not_run(op));
    }
    if let [Value::Int(-1), message, _] = values {
        return Err(op_failed(
            op,
            match message {
                Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                other => format!("{other:?}"),
            },
        ));
    }
    let mut reply = [0; 3];
    for (slot, value) in reply.iter_mut().zip(values) {
        *slot = match value {
            Value::Int(n) => *n,
            Value::BulkString(digits) => decimal(digits)
                .ok_or_else(|| op_failed(op, format!("unexpected reply element {value:?}")))?,
            other => {
                return Err(op_failed(op, format!("unexpected reply element {other:?}")));
            }
        };
    }
    Ok(reply)
}

/// Whether an acquire's reply grants it (`ops.lua`: 1, granted; 2, holding).
fn granted(reply: &OpReply) -> bool {
    matches!(reply, Ok(synced) if matches!(synced.reply[0], 1 | 2))
}

/// The reply of an operation of an all-or-nothing run that was not sent: an earlier one of
/// the run was refused.
fn not_run(op: &Op) -> LockError {
    let user = &op.names().user;
    LockError::new(
        ErrorKind::Backend,
        format!(
            "redis lock operation on `{user}` failed: not run: an earlier operation of its \
             all-or-nothing run was not granted"
        ),
    )
    .with_key(user)
}

fn bad_batch(ops: &[Op], why: &str) -> LockError {
    LockError::new(
        ErrorKind::Backend,
        format!(
            "unexpected reply from the lock operations script for {} operation(s): {why}",
            ops.len()
        ),
    )
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use std::time::Duration;

    use super::super::ids::new_grant_id;
    use super::super::target::Target;
    use super::*;
    use crate::kinds::mutex::{LAYOUT, MUTEX};

    /// A release of a grant nobody holds (Redis replies "not held": harmless).
    fn release(engine: &Engine) -> Op {
        let names = engine.names(LAYOUT.namespace, "batch-slots").unwrap();
        Op::Release {
            target: Target::new(&MUTEX, names),
            owner: "o".into(),
            grant: new_grant_id(),
            next: None,
            in_turn: false,
            keep_until: None,
        }
    }

    /// `run_op` takes its call slot when it is called: a future of it dropped before it was
    /// polled must give the slot back, or every later operation of the service would queue
    /// behind calls that never come back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_operation_dropped_before_it_ran_gives_its_slot_back() {
        let server = crate::testing::RedisServer::start().await.unwrap();
        let config = server
            .config()
            .with_response_timeout(Duration::from_secs(2));
        let locks = crate::LockService::connect(config).await.unwrap();
        let engine = &locks.inner;
        for _ in 0..2 * (super::super::batcher::IN_FLIGHT + 1) {
            drop(engine.run_op(release(engine)));
        }
        let reply = engine
            .run_op(release(engine))
            .await
            .expect("sent, not queued");
        assert_eq!(reply.reply, [0, 0, 0], "not held");
        locks.shutdown().await.unwrap();
    }
}

#[cfg(test)]
mod decimal_tests {
    use super::decimal;

    #[test]
    fn decimal_texts_parse_as_the_scripts_write_them() {
        assert_eq!(decimal(b"0"), Some(0));
        assert_eq!(decimal(b"-1"), Some(-1));
        assert_eq!(decimal(b"1795843186389754"), Some(1_795_843_186_389_754));
        assert_eq!(
            decimal(b"999999999999999999"),
            Some(999_999_999_999_999_999)
        );
        for bad in [
            &b""[..],
            b"-",
            b"12a",
            b"1.5",
            b" 1",
            b"+1",
            b"1234567890123456789",
        ] {
            assert_eq!(decimal(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
