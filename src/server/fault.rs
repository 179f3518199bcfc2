//! Fault injection for tests, compiled only with the cargo feature `fault-injection` (which
//! `make test` turns on; release builds and `make static`/`make cross` never have it).
//!
//! SIGUSR1 wedges the DHCP engine task (it blocks its worker thread in the next loop
//! iteration); SIGUSR2 wedges the lease store thread (it is handed a job that never returns).
//! Both stay wedged until the process ends: tests use them to show that the watchdog pings
//! stop, which is what makes systemd restart a wedged daemon.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

use crate::store::StoreWriter;

static ENGINE_WEDGED: AtomicBool = AtomicBool::new(false);

/// Installs the signal handlers; call before READY=1 so a test's signal never meets the
/// default action (which would end the process).
pub fn install(writer: StoreWriter) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                Some(()) = usr1.recv() => {
                    tracing::warn!("fault injection: wedging the DHCP engine");
                    ENGINE_WEDGED.store(true, Ordering::SeqCst);
                }
                Some(()) = usr2.recv() => {
                    tracing::warn!("fault injection: wedging the lease store thread");
                    // The job never returns, so neither does this call: run it on its own task.
                    let w = writer.clone();
                    tokio::spawn(async move {
                        w.with(|_| loop {
                            std::thread::park();
                        })
                        .await
                    });
                }
                else => return,
            }
        }
    }))
}

/// Called by the engine at the top of every loop iteration: blocks forever once wedged.
pub fn engine_checkpoint() {
    while ENGINE_WEDGED.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
}
