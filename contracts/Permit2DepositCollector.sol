// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @notice The part of Permit2's signature transfer this collector uses.
interface IPermit2WitnessTransfer {
    struct TokenPermissions {
        address token;
        uint256 amount;
    }

    struct PermitTransferFrom {
        TokenPermissions permitted;
        uint256 nonce;
        uint256 deadline;
    }

    struct SignatureTransferDetails {
        address to;
        uint256 requestedAmount;
    }

    function permitWitnessTransferFrom(
        PermitTransferFrom memory permit,
        SignatureTransferDetails calldata transferDetails,
        address owner,
        bytes32 witness,
        string calldata witnessTypeString,
        bytes calldata signature
    ) external;
}

/// @title Permit2DepositCollector — Permit2 deposits into x402 batch-settlement channels, for local tests.
/// @notice Placed at the canonical address (0x4020425FAf3B746C082C2f942b4E5159887B0005) on a test
///         chain with `anvil_setCode`, next to X402BatchSettlement (which alone may call it) and
///         Permit2 at their canonical addresses. The payer signs a Permit2
///         `PermitWitnessTransferFrom` with this collector as spender and the witness
///         `DepositWitness(bytes32 channelId)`, so the transfer is good for that one channel only;
///         Permit2 moves the tokens straight to the settlement contract. An optional EIP-2612 permit
///         (the payer's approval of Permit2, for tokens that have `permit`) is applied first.
///
///         collectorData = abi.encode(uint256 nonce, uint256 deadline, bytes permit2Signature, bytes eip2612Permit)
///         eip2612Permit = empty, or abi.encode(uint256 value, uint256 deadline, uint8 v, bytes32 r, bytes32 s)
/// @dev Written for this project. No storage, no constructor: the addresses are constants.
contract Permit2DepositCollector {
    address public constant SETTLEMENT = 0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003;
    address public constant PERMIT2 = 0x000000000022D473030F116dDEE9F6B43aC78BA3;

    bytes32 public constant DEPOSIT_WITNESS_TYPEHASH = keccak256("DepositWitness(bytes32 channelId)");
    /// @notice The witness part of the type string Permit2 hashes (its referenced types sorted by name).
    string public constant WITNESS_TYPE_STRING =
        "DepositWitness witness)DepositWitness(bytes32 channelId)TokenPermissions(address token,uint256 amount)";

    error OnlySettlement();

    /// @notice Moves `amount` of `token` from `payer` to the settlement contract through Permit2,
    ///         with the payer's signature in `data` bound to `channelId`.
    function collect(address payer, address token, uint128 amount, bytes32 channelId, bytes calldata data) external {
        if (msg.sender != SETTLEMENT) revert OnlySettlement();
        (uint256 nonce, uint256 deadline, bytes memory signature, bytes memory eip2612Permit) =
            abi.decode(data, (uint256, uint256, bytes, bytes));
        if (eip2612Permit.length != 0) applyPermit(payer, token, eip2612Permit);

        IPermit2WitnessTransfer(PERMIT2).permitWitnessTransferFrom(
            IPermit2WitnessTransfer.PermitTransferFrom({
                permitted: IPermit2WitnessTransfer.TokenPermissions({token: token, amount: amount}),
                nonce: nonce,
                deadline: deadline
            }),
            IPermit2WitnessTransfer.SignatureTransferDetails({to: SETTLEMENT, requestedAmount: amount}),
            payer,
            keccak256(abi.encode(DEPOSIT_WITNESS_TYPEHASH, channelId)),
            WITNESS_TYPE_STRING,
            signature
        );
    }

    /// @dev EIP-2612 `permit(payer, PERMIT2, value, deadline, v, r, s)`. Its failure is ignored: the
    ///      approval may already be in place (or someone used this permit first); Permit2's transfer
    ///      then fails on its own if the allowance is missing.
    function applyPermit(address payer, address token, bytes memory eip2612Permit) private {
        (uint256 value, uint256 deadline, uint8 v, bytes32 r, bytes32 s) =
            abi.decode(eip2612Permit, (uint256, uint256, uint8, bytes32, bytes32));
        (bool ignored,) = token.call(
            abi.encodeWithSignature(
                "permit(address,address,uint256,uint256,uint8,bytes32,bytes32)", payer, PERMIT2, value, deadline, v, r, s
            )
        );
        ignored;
    }
}
