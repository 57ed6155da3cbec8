//! The agent's end of a tunnel into a task (a shell, a command, a declared port). The server
//! asked in a poll answer; the agent dials out to it, so a node needs no open port.
//!
//! Exec tunnels carry a channel byte before each binary frame (stdin, stdout, stderr) and
//! JSON control frames (resize, end of input, exit); port tunnels carry the bytes alone.

use std::sync::Arc;
use std::time::Duration;

use autodl_common::agent::{channel, TunnelControl, TunnelRequest, TunnelTarget};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::client::ServerClient;
use crate::runtime::{ExecReader, ExecSpec, Runtime, TaskLaunch};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Bytes read from a command or a port before they are sent as one frame.
const CHUNK: usize = 32 * 1024;

/// How long connecting to a task's port may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves one tunnel to its end. `launch` is the attempt as it runs here; `None` when it does
/// not (any more): the person is told so.
pub async fn serve(
    client: &ServerClient,
    runtime: Arc<dyn Runtime>,
    launch: Option<TaskLaunch>,
    req: TunnelRequest,
) {
    // The server holding the person's side first, then this agent's own.
    let mut servers = vec![req.server.as_deref()];
    if req.server.is_some() {
        servers.push(None);
    }
    let mut opened = None;
    for server in servers {
        let request = match client.tunnel_request(&req.id, server) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(tunnel = req.id, error = %e, "cannot address the tunnel");
                continue;
            }
        };
        match tokio_tungstenite::connect_async(request).await {
            Ok((ws, _)) => {
                opened = Some(ws);
                break;
            }
            Err(e) => {
                tracing::warn!(tunnel = req.id, ?server, error = %e, "could not open the tunnel to the server")
            }
        }
    }
    let Some(ws) = opened else { return };
    let (sink, stream) = ws.split();
    let Some(launch) = launch else {
        refuse(sink, stream, "the task does not run on this node any more").await;
        return;
    };
    tracing::info!(task = req.task_id, attempt = req.attempt, target = ?req.target, "tunnel open");
    match req.target {
        TunnelTarget::Exec {
            command,
            tty,
            cols,
            rows,
        } => {
            let spec = ExecSpec {
                command,
                tty,
                cols: if cols == 0 { 80 } else { cols },
                rows: if rows == 0 { 24 } else { rows },
            };
            exec(sink, stream, runtime.as_ref(), &launch, &spec).await;
        }
        TunnelTarget::Port { port } => forward(sink, stream, runtime.as_ref(), &launch, port).await,
    }
    tracing::info!(task = req.task_id, tunnel = req.id, "tunnel closed");
}

fn control(c: &TunnelControl) -> Message {
    Message::text(serde_json::to_string(c).unwrap_or_default())
}

async fn refuse(mut sink: SplitSink<Socket, Message>, stream: SplitStream<Socket>, message: &str) {
    let _ = sink
        .send(control(&TunnelControl::Error {
            message: message.to_owned(),
        }))
        .await;
    let _ = sink.close().await;
    closed(stream).await;
}

/// Waits for the server's answer to our close: dropping the socket before it would reset
/// the connection, and the server could lose the last frames it had not read yet.
async fn closed(mut stream: SplitStream<Socket>) {
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(m)) = stream.next().await {
            if m.is_close() {
                break;
            }
        }
    })
    .await;
}

/// Sends what the channel receives, in order, then closes the socket.
async fn write_all(mut sink: SplitSink<Socket, Message>, mut rx: mpsc::Receiver<Message>) {
    while let Some(m) = rx.recv().await {
        if sink.send(m).await.is_err() {
            return;
        }
    }
    let _ = sink.close().await;
}

/// Reads `reader` to its end, each chunk one frame (after `prefix`, when there is one).
async fn pump(mut reader: ExecReader, prefix: Option<u8>, tx: mpsc::Sender<Message>) {
    let start = usize::from(prefix.is_some());
    let mut buf = vec![0u8; CHUNK + start];
    if let Some(p) = prefix {
        buf[0] = p;
    }
    loop {
        // A terminal whose last holder closed reads as an error (EIO): that is its end.
        let n = match reader.read(&mut buf[start..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if tx
            .send(Message::binary(buf[..start + n].to_vec()))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// How long output is still read after a command's exit, when its output outlasts it.
const LAST_OUTPUT: Duration = Duration::from_millis(200);

/// Resolves once the command has exited, where that is known apart from its output's end
/// (never, elsewhere).
async fn exited(exit: &mut Option<tokio::sync::watch::Receiver<Option<i32>>>) {
    match exit {
        Some(w) => {
            if w.wait_for(Option::is_some).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

async fn exec(
    sink: SplitSink<Socket, Message>,
    mut stream: SplitStream<Socket>,
    runtime: &dyn Runtime,
    launch: &TaskLaunch,
    spec: &ExecSpec,
) {
    let started = match runtime.exec(launch, spec).await {
        Ok(e) => e,
        Err(e) => {
            refuse(sink, stream, &format!("could not start the command: {e}")).await;
            return;
        }
    };
    let (tx, rx) = mpsc::channel::<Message>(64);
    let writer = tokio::spawn(write_all(sink, rx));
    let mut stdin = Some(started.stdin);
    let mut control_handle = started.control;
    let mut exit = control_handle.exited();
    let mut outputs = vec![tokio::spawn(pump(
        started.stdout,
        Some(channel::STDOUT),
        tx.clone(),
    ))];
    if let Some(err) = started.stderr {
        outputs.push(tokio::spawn(pump(err, Some(channel::STDERR), tx.clone())));
    }
    let pumps: Vec<tokio::task::AbortHandle> = outputs.iter().map(|o| o.abort_handle()).collect();
    let mut outputs_done = Box::pin(futures_util::future::join_all(outputs));
    let ended = loop {
        tokio::select! {
            _ = &mut outputs_done => break true,
            _ = exited(&mut exit) => {
                // What it printed last is read by now or just after; what it left running
                // in the background keeps the output open, but the command has ended.
                let _ = tokio::time::timeout(LAST_OUTPUT, &mut outputs_done).await;
                break true;
            }
            msg = stream.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    if b.first() == Some(&channel::STDIN) {
                        if let Some(w) = stdin.as_mut() {
                            if w.write_all(&b[1..]).await.is_err() {
                                stdin = None;
                            } else {
                                let _ = w.flush().await;
                            }
                        }
                    }
                }
                Some(Ok(Message::Text(t))) => match serde_json::from_str::<TunnelControl>(&t) {
                    Ok(TunnelControl::Resize { cols, rows }) if cols > 0 && rows > 0 => {
                        let _ = control_handle.resize(cols, rows).await;
                    }
                    Ok(TunnelControl::Eof) => {
                        if let Some(mut w) = stdin.take() {
                            let _ = w.shutdown().await;
                        }
                    }
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break false,
                Some(Ok(_)) => {}
            },
        }
    };
    if ended {
        drop(stdin);
        let code = control_handle.wait().await.unwrap_or(-1);
        let _ = tx.send(control(&TunnelControl::Exit { code })).await;
    }
    // The person left first: dropping the command ends it.
    drop(control_handle);
    for p in pumps {
        p.abort();
    }
    drop(tx);
    let _ = writer.await;
    if ended {
        closed(stream).await;
    }
}

async fn forward(
    sink: SplitSink<Socket, Message>,
    mut stream: SplitStream<Socket>,
    runtime: &dyn Runtime,
    launch: &TaskLaunch,
    port: u16,
) {
    let tcp = match runtime.connect_port(launch, port, CONNECT_TIMEOUT).await {
        Ok(s) => s,
        Err(e) => {
            let why = format!("the task's port {port} cannot be reached: {e}");
            refuse(sink, stream, &why).await;
            return;
        }
    };
    let (read, mut write) = tcp.into_split();
    let (tx, rx) = mpsc::channel::<Message>(64);
    let writer = tokio::spawn(write_all(sink, rx));
    let mut from_task = tokio::spawn(pump(Box::pin(read), None, tx));
    let task_ended = loop {
        tokio::select! {
            _ = &mut from_task => break true,
            msg = stream.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    if write.write_all(&b).await.is_err() {
                        break true;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break false,
                Some(Ok(_)) => {}
            },
        }
    };
    from_task.abort();
    let _ = write.shutdown().await;
    let _ = writer.await;
    if task_ended {
        closed(stream).await;
    }
}
