//! `receipts verify FILE|-`: offline receipt tools.

use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct ReceiptsArgs {
    #[command(subcommand)]
    pub command: ReceiptsCommand,
}

#[derive(Debug, Subcommand)]
pub enum ReceiptsCommand {
    /// Verify a receipt's signature offline: prints `valid: signed by 0x…` (exit 0) or
    /// `invalid: <reason>` (exit 1); exit 2 if the file cannot be read. Compare the signer
    /// with `receipt_signer` of GET /.well-known/x402-router.
    Verify {
        /// A receipt JSON file (as served by GET /receipts/{id}), or `-` for stdin.
        file: String,
    },
}

/// `receipts verify FILE|-`: prints `valid: signed by 0x…` (exit 0) or `invalid: <reason>`
/// (exit 1); a file that cannot be read is `error: …` on stderr (exit 2).
pub fn run(args: &ReceiptsArgs) -> std::process::ExitCode {
    use std::io::Read;
    use std::process::ExitCode;
    let ReceiptsCommand::Verify { file } = &args.command;
    let text = if file == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map(|_| text)
    } else {
        std::fs::read_to_string(file)
    };
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot read {file}: {e}");
            return ExitCode::from(2);
        }
    };
    match crate::audit::verify_receipt(&text) {
        Ok(signer) => {
            println!("valid: signed by {}", signer.to_checksum(None));
            ExitCode::SUCCESS
        }
        Err(reason) => {
            println!("invalid: {reason}");
            ExitCode::from(1)
        }
    }
}
