//! How one script call is sent: as a Redis Function or with `EVALSHA`, loading what the server
//! lacks, optionally followed by `WAIT` in the same round trip.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::FromRedisValue;
use redis::aio::ConnectionLike;

use crate::scripts::{Function, ScriptCall};

/// Runs a script call: an `FCALL` loads its library and goes again when the server lacks it
/// (a server restarted without persistence, a node new to the cluster, `FUNCTION FLUSH`); a
/// server without Functions, or a user refused them, turns `functions` off and the call goes as
/// `EVALSHA` (none of these errors comes from a function that ran). An `EVALSHA` loads the
/// script and goes again on NOSCRIPT.
pub(super) async fn invoke<C, T>(
    con: &mut C,
    call: &ScriptCall<'_>,
    functions: &AtomicBool,
) -> redis::RedisResult<T>
where
    C: ConnectionLike + Send,
    T: FromRedisValue,
{
    let Some(function) = call.function else {
        return evalsha(con, call).await;
    };
    let mut result = call.cmd.query_async(con).await;
    if matches!(&result, Err(e) if is_function_missing(e)) {
        // a refused load falls back below, like a refused call
        result = match load_library(con, function).await {
            Ok(()) => call.cmd.query_async(con).await,
            Err(e) => Err(e),
        };
    }
    match result {
        Err(e) if refuses_functions(&e) => {
            no_functions(functions, &e);
            evalsha(con, &call.as_script()).await
        }
        other => other,
    }
}

/// `EVALSHA`, loading the script and going again on NOSCRIPT.
async fn evalsha<C, T>(con: &mut C, call: &ScriptCall<'_>) -> redis::RedisResult<T>
where
    C: ConnectionLike + Send,
    T: FromRedisValue,
{
    match call.cmd.query_async(con).await {
        Err(e) if is_noscript(&e) => {
            call.script.load_async(con).await?;
            call.cmd.query_async(con).await
        }
        other => other,
    }
}

/// `FUNCTION LOAD REPLACE` of `function`'s library (in cluster mode on every master).
async fn load_library<C: ConnectionLike + Send>(
    con: &mut C,
    function: &Function,
) -> redis::RedisResult<()> {
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&function.library)
        .query_async(con)
        .await
}

fn no_functions(functions: &AtomicBool, e: &redis::RedisError) {
    if functions.swap(false, Ordering::Relaxed) {
        tracing::info!(error = %e, "redis refused Functions: lock operations go as EVALSHA");
    }
}

fn is_function_missing(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
        && server_detail(e).is_some_and(|d| d.starts_with("Function not found"))
}

/// A server without Functions (`FCALL` or `FUNCTION` unknown, before Redis 7.0), or a user
/// whose ACL denies `FCALL` or `FUNCTION LOAD`.
fn refuses_functions(e: &redis::RedisError) -> bool {
    match e.kind() {
        redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => true,
        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => server_detail(e)
            .is_some_and(|d| {
                d.starts_with("unknown command") || d.starts_with("unknown subcommand")
            }),
        _ => false,
    }
}

/// The text of a server's error reply, also when it came as the first failure of a pipeline
/// (whose `kind` is that failure's, but whose `detail` is not kept).
fn server_detail(e: &redis::RedisError) -> Option<String> {
    if let Some(detail) = e.detail() {
        return Some(detail.to_owned());
    }
    let failures = e.clone().into_server_errors()?;
    let (_, first) = failures.first()?;
    first.details().map(str::to_owned)
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// The script call + `WAIT replicas timeout` in one pipeline on one connection (`WAIT` counts
/// the acknowledgements of that connection's writes). Pipelines do not load scripts by
/// themselves: a missing script or library is loaded and the pipeline sent again (see
/// [`invoke`] for the Functions' fallback).
pub(super) async fn with_wait<C, T>(
    con: &mut C,
    call: &ScriptCall<'_>,
    replicas: u32,
    timeout: Duration,
    functions: &AtomicBool,
) -> redis::RedisResult<(T, i64)>
where
    C: ConnectionLike + Send,
    T: FromRedisValue,
{
    let timeout_ms = u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let Some(function) = call.function else {
        return evalsha_waited(con, call, replicas, timeout_ms).await;
    };
    let pipe = waited(call, replicas, timeout_ms);
    let mut result = pipe.query_async(con).await;
    if matches!(&result, Err(e) if is_function_missing(e)) {
        result = match load_library(con, function).await {
            Ok(()) => pipe.query_async(con).await,
            Err(e) => Err(e),
        };
    }
    match result {
        Err(e) if refuses_functions(&e) => {
            no_functions(functions, &e);
            evalsha_waited(con, &call.as_script(), replicas, timeout_ms).await
        }
        other => other,
    }
}

/// [`with_wait`] of an `EVALSHA`.
async fn evalsha_waited<C, T>(
    con: &mut C,
    call: &ScriptCall<'_>,
    replicas: u32,
    timeout_ms: u64,
) -> redis::RedisResult<(T, i64)>
where
    C: ConnectionLike + Send,
    T: FromRedisValue,
{
    let pipe = waited(call, replicas, timeout_ms);
    match pipe.query_async(con).await {
        Err(e) if is_noscript(&e) => {
            call.script.load_async(con).await?;
            pipe.query_async(con).await
        }
        other => other,
    }
}

fn waited(call: &ScriptCall<'_>, replicas: u32, timeout_ms: u64) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.add_command(call.cmd.clone())
        .cmd("WAIT")
        .arg(replicas)
        .arg(timeout_ms);
    pipe
}
