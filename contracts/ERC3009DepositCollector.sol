// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @title ERC3009DepositCollector — EIP-3009 deposits into x402 batch-settlement channels, for local tests.
/// @notice Placed at the canonical address (0x4020806089470a89826cB9fB1f4059150b550004) on a test
///         chain with `anvil_setCode`, next to X402BatchSettlement at its canonical address, which
///         alone may call it. The payer signs an EIP-3009 `ReceiveWithAuthorization` to this
///         collector whose nonce is keccak256(abi.encode(channelId, salt)): the authorization is
///         good for that one channel only, so whoever submits the deposit cannot credit it
///         elsewhere. The collector redeems it and forwards the tokens to the settlement contract.
///
///         collectorData = abi.encode(uint256 validAfter, uint256 validBefore, uint256 salt, bytes signature)
/// @dev Written for this project. No storage, no constructor: the settlement address is a constant.
contract ERC3009DepositCollector {
    /// @notice The settlement contract this collector serves (its canonical address).
    address public constant SETTLEMENT = 0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003;

    error OnlySettlement();
    error TransferFailed();

    /// @notice Pulls `amount` of `token` from `payer` with the payer's EIP-3009 authorization in
    ///         `data` and hands it to the settlement contract.
    function collect(address payer, address token, uint128 amount, bytes32 channelId, bytes calldata data) external {
        if (msg.sender != SETTLEMENT) revert OnlySettlement();
        (uint256 validAfter, uint256 validBefore, uint256 salt, bytes memory signature) =
            abi.decode(data, (uint256, uint256, uint256, bytes));
        bytes32 nonce = keccak256(abi.encode(channelId, salt));

        // receiveWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes): only the
        // payee (this collector) may redeem it, so nobody can front-run it into a plain transfer.
        (bool ok, bytes memory answer) = token.call(
            abi.encodeWithSignature(
                "receiveWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes)",
                payer,
                address(this),
                uint256(amount),
                validAfter,
                validBefore,
                nonce,
                signature
            )
        );
        if (!ok) {
            assembly ("memory-safe") {
                revert(add(answer, 0x20), mload(answer))
            }
        }

        (ok, answer) = token.call(abi.encodeWithSelector(0xa9059cbb, SETTLEMENT, uint256(amount)));
        if (!ok || (answer.length != 0 && !abi.decode(answer, (bool)))) revert TransferFailed();
    }
}
