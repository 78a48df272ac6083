//! Chain plumbing the router keeps beside the payment schemes: the EVM chain index of each
//! network with a WebSocket URL (`evm_index`) and the Solana wallet with its networks' RPC
//! endpoints (`solana`). The schemes (`relay/pay/`) reach them; they know nothing of the walk.

pub mod evm_index;
pub mod solana;
