//! What a transaction moved out of a payer's balance, from its `Transfer` logs.

use alloy::primitives::{Address, B256, U256};
use alloy::providers::Provider;
use alloy::sol_types::SolEvent;

use super::permit2::IErc20Transfer;
use super::{Chain, ChainError};
use crate::network::Network;

impl Chain {
    /// The sum of the token `asset`'s `Transfer`s out of `from` in the successful transaction
    /// `tx` (`None`: unknown to the node, pending or reverted). Never less than what any one
    /// authorization of `from` settled in it moved: a ceiling for the charge of one payment.
    ///
    /// # Errors
    /// [`ChainError::UnknownNetwork`], [`ChainError::Timeout`], [`ChainError::Rpc`].
    pub async fn transferred_from(
        &self,
        network: Network,
        asset: Address,
        from: Address,
        tx: B256,
    ) -> Result<Option<U256>, ChainError> {
        let endpoint = self.endpoint(network)?;
        let receipt = self
            .bounded(endpoint, network, endpoint.provider.get_transaction_receipt(tx))
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        let Some(receipt) = receipt.filter(|r| r.status()) else { return Ok(None) };
        let mut moved = U256::ZERO;
        for log in receipt.inner.logs() {
            let t = log.topics();
            if log.address() == asset
                && t.len() == 3
                && t[0] == IErc20Transfer::Transfer::SIGNATURE_HASH
                && t[1] == from.into_word()
            {
                moved = moved.saturating_add(U256::try_from_be_slice(&log.data().data).unwrap_or(U256::MAX));
            }
        }
        Ok(Some(moved))
    }
}
