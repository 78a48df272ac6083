// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @notice What the settlement contract asks of a deposit collector: pull exactly `amount` of
///         `token` from `payer` into the settlement contract, authorized by `data`, for the channel
///         `channelId` (the collector binds its authorization to that id).
interface IBatchDepositCollector {
    function collect(address payer, address token, uint128 amount, bytes32 channelId, bytes calldata data) external;
}

/// @title X402BatchSettlement — payment channels of the x402 `batch-settlement` scheme, for local tests.
/// @notice Placed at the scheme's canonical address (0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003) on a
///         test chain with `anvil_setCode`, so that the official x402 EVM packages' batch-settlement
///         client, server and facilitator run against it unchanged: same function and event ABI, same EIP-712
///         domain ({name: "x402 Batch Settlement", version: "1", chainId, verifyingContract}) and type
///         strings, same channel id (the EIP-712 hash of the channel's config under that domain).
///
///         A payer deposits into a channel through a deposit collector (EIP-3009 or Permit2); the
///         receiver side claims cumulative vouchers the payer (or its payer authorizer) signed, which
///         only moves accounting; `settle` then pays a receiver everything claimed for it in one
///         transfer. The unclaimed rest goes back to the payer by a cooperative refund (receiver side,
///         directly or with its authorizer's signature) or by the payer's timed withdrawal, which
///         waits the channel's withdraw delay so that the receiver can claim first.
/// @dev Written for this project from the scheme's specification and the ABI its packages use.
///      No constructor state: the domain separator is computed per call and the reentrancy lock
///      lives in transient storage, so runtime code copied with `anvil_setCode` works as is.
///      Balances are uint128 (the ABI's width); fee-on-transfer tokens are refused by the
///      deposit's balance check.
contract X402BatchSettlement {
    // ---------------------------------------------------------------- types (the ABI's tuples)

    /// @notice A channel's immutable parameters; its id is their EIP-712 hash.
    struct ChannelConfig {
        address payer; // whose tokens are deposited and get refunded
        address payerAuthorizer; // EOA that signs vouchers; zero: the payer signs (ERC-1271 if a contract)
        address receiver; // who is paid on settle
        address receiverAuthorizer; // signs claim batches and refunds for the receiver; never zero
        address token;
        uint40 withdrawDelay; // seconds between initiateWithdraw and finalizeWithdraw
        bytes32 salt; // tells apart channels with otherwise equal parameters
    }

    /// @notice The payer's promise: the receiver may claim up to `maxClaimableAmount` in total.
    struct Voucher {
        ChannelConfig channel;
        uint128 maxClaimableAmount;
    }

    /// @notice One claim row: a signed voucher and the cumulative total claimed with it
    ///         (at most the voucher's ceiling).
    struct VoucherClaim {
        Voucher voucher;
        bytes signature;
        uint128 totalClaimed;
    }

    /// @notice Escrowed balance of a channel (deposits less refunds and withdrawals) and the
    ///         cumulative amount claimed from it; `totalClaimed <= balance` always holds.
    struct ChannelState {
        uint128 balance;
        uint128 totalClaimed;
    }

    struct PendingWithdrawal {
        uint128 amount;
        uint40 initiatedAt; // zero: none pending
    }

    /// @notice What was claimed for a receiver in a token, and how much of it was paid out.
    struct ReceiverTotals {
        uint128 totalClaimed;
        uint128 totalSettled;
    }

    // ---------------------------------------------------------------- constants

    uint40 public constant MIN_WITHDRAW_DELAY = 900; // 15 minutes
    uint40 public constant MAX_WITHDRAW_DELAY = 2_592_000; // 30 days

    bytes32 public constant CHANNEL_CONFIG_TYPEHASH = keccak256(
        "ChannelConfig(address payer,address payerAuthorizer,address receiver,address receiverAuthorizer,address token,uint40 withdrawDelay,bytes32 salt)"
    );
    bytes32 public constant VOUCHER_TYPEHASH = keccak256("Voucher(bytes32 channelId,uint128 maxClaimableAmount)");
    bytes32 public constant REFUND_TYPEHASH = keccak256("Refund(bytes32 channelId,uint256 nonce,uint128 amount)");
    bytes32 public constant CLAIM_ENTRY_TYPEHASH =
        keccak256("ClaimEntry(bytes32 channelId,uint128 maxClaimableAmount,uint128 totalClaimed)");
    bytes32 public constant CLAIM_BATCH_TYPEHASH = keccak256(
        "ClaimBatch(ClaimEntry[] claims)ClaimEntry(bytes32 channelId,uint128 maxClaimableAmount,uint128 totalClaimed)"
    );

    bytes32 private constant DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");
    string private constant DOMAIN_NAME = "x402 Batch Settlement";
    string private constant DOMAIN_VERSION = "1";

    /// @dev Upper bound for `s` (secp256k1 order / 2): higher values are malleable copies.
    uint256 private constant HALF_CURVE_ORDER = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0;
    bytes4 private constant ERC1271_MAGIC_VALUE = 0x1626ba7e;

    // ---------------------------------------------------------------- storage

    mapping(bytes32 channelId => ChannelState) public channels;
    mapping(bytes32 channelId => PendingWithdrawal) public pendingWithdrawals;
    /// @notice The nonce the next signed refund of a channel must carry; every refund (signed or
    ///         direct, moving tokens or not) advances it.
    mapping(bytes32 channelId => uint256) public refundNonce;
    mapping(address receiver => mapping(address token => ReceiverTotals)) public receivers;

    // ---------------------------------------------------------------- events

    /// @notice A deposit found the channel empty (nothing escrowed, nothing ever claimed).
    event ChannelCreated(bytes32 indexed channelId, ChannelConfig config);
    /// @notice A refund or withdrawal left the channel empty with nothing ever claimed.
    event ChannelClosed(bytes32 indexed channelId, ChannelConfig config);
    event Deposited(bytes32 indexed channelId, address indexed sender, uint128 amount, uint128 newBalance);
    event Claimed(bytes32 indexed channelId, address indexed sender, uint128 claimAmount, uint128 newTotalClaimed);
    event Settled(address indexed receiver, address indexed token, address indexed sender, uint128 amount);
    event Refunded(bytes32 indexed channelId, address indexed sender, uint128 amount);
    event WithdrawInitiated(bytes32 indexed channelId, uint128 amount, uint40 finalizeAfter);
    event WithdrawFinalized(bytes32 indexed channelId, address indexed sender, uint128 amount);

    // ---------------------------------------------------------------- errors

    error InvalidChannel();
    error WithdrawDelayOutOfRange();
    error ZeroDeposit();
    error InvalidCollector();
    error DepositOverflow();
    error DepositCollectionFailed();
    error EmptyBatch();
    error NotAuthorizedToClaim();
    error NotReceiverAuthorizer();
    error ClaimExceedsCeiling();
    error ClaimExceedsBalance();
    error InvalidSignature();
    error NotAuthorizedToWithdraw();
    error NothingToWithdraw();
    error WithdrawalAlreadyPending();
    error WithdrawAmountExceedsAvailable();
    error WithdrawalNotPending();
    error WithdrawDelayNotElapsed();
    error NotAuthorizedToRefund();
    error ZeroRefund();
    error InvalidRefundNonce();
    error TransferFailed();
    error Reentered();

    // ---------------------------------------------------------------- reentrancy lock

    /// @dev Transient slot of the lock (EIP-1153): cleared at the end of every transaction.
    uint256 private constant LOCK_SLOT = 0x6c6f63616c2e783430322e62617463682d736574746c656d656e742e6c6f636b;

    modifier locked() {
        uint256 held;
        assembly ("memory-safe") {
            held := tload(LOCK_SLOT)
        }
        if (held != 0) revert Reentered();
        assembly ("memory-safe") {
            tstore(LOCK_SLOT, 1)
        }
        _;
        assembly ("memory-safe") {
            tstore(LOCK_SLOT, 0)
        }
    }

    // ---------------------------------------------------------------- batching

    /// @notice Runs each call on this contract in order, in one transaction; the first failure
    ///         reverts all of them (the facilitator's claim-then-refund uses it).
    function multicall(bytes[] calldata data) external returns (bytes[] memory results) {
        results = new bytes[](data.length);
        for (uint256 i = 0; i < data.length; i++) {
            (bool ok, bytes memory answer) = address(this).delegatecall(data[i]);
            if (!ok) {
                assembly ("memory-safe") {
                    revert(add(answer, 0x20), mload(answer))
                }
            }
            results[i] = answer;
        }
    }

    // ---------------------------------------------------------------- deposits

    /// @notice Adds exactly `amount` to the channel of `config`, pulled from the payer by
    ///         `collector` with the authorization in `collectorData`. Anyone may submit it (the
    ///         facilitator pays the gas); the collector binds the payer's authorization to this
    ///         channel, and this contract checks that its token balance grew by `amount`.
    function deposit(ChannelConfig calldata config, uint128 amount, address collector, bytes calldata collectorData)
        external
        locked
    {
        if (
            config.payer == address(0) || config.receiver == address(0) || config.receiverAuthorizer == address(0)
                || config.token == address(0)
        ) revert InvalidChannel();
        if (config.withdrawDelay < MIN_WITHDRAW_DELAY || config.withdrawDelay > MAX_WITHDRAW_DELAY) {
            revert WithdrawDelayOutOfRange();
        }
        if (amount == 0) revert ZeroDeposit();
        if (collector == address(0) || collector.code.length == 0) revert InvalidCollector();

        bytes32 channelId = getChannelId(config);
        ChannelState storage channel = channels[channelId];
        if (uint256(channel.balance) + amount > type(uint128).max) revert DepositOverflow();
        bool wasEmpty = channel.balance == 0 && channel.totalClaimed == 0;

        uint256 before = tokenBalance(config.token);
        IBatchDepositCollector(collector).collect(config.payer, config.token, amount, channelId, collectorData);
        if (tokenBalance(config.token) != before + amount) revert DepositCollectionFailed();

        channel.balance += amount;
        if (wasEmpty) emit ChannelCreated(channelId, config);
        emit Deposited(channelId, msg.sender, amount, channel.balance);
    }

    // ---------------------------------------------------------------- claims and settlement

    /// @notice Applies claim rows; the caller must be the receiver or the receiver authorizer of
    ///         every row's channel.
    function claim(VoucherClaim[] calldata voucherClaims) external locked {
        if (voucherClaims.length == 0) revert EmptyBatch();
        for (uint256 i = 0; i < voucherClaims.length; i++) {
            ChannelConfig calldata config = voucherClaims[i].voucher.channel;
            if (msg.sender != config.receiver && msg.sender != config.receiverAuthorizer) {
                revert NotAuthorizedToClaim();
            }
            applyClaim(voucherClaims[i]);
        }
    }

    /// @notice Applies claim rows that the receiver authorizer of all of them signed as one
    ///         EIP-712 `ClaimBatch`; anyone may submit it.
    function claimWithSignature(VoucherClaim[] calldata voucherClaims, bytes calldata authorizerSignature)
        external
        locked
    {
        if (voucherClaims.length == 0) revert EmptyBatch();
        address authorizer = voucherClaims[0].voucher.channel.receiverAuthorizer;
        for (uint256 i = 1; i < voucherClaims.length; i++) {
            if (voucherClaims[i].voucher.channel.receiverAuthorizer != authorizer) revert NotReceiverAuthorizer();
        }
        if (!isValidSignatureNow(authorizer, getClaimBatchDigest(voucherClaims), authorizerSignature)) {
            revert InvalidSignature();
        }
        for (uint256 i = 0; i < voucherClaims.length; i++) {
            applyClaim(voucherClaims[i]);
        }
    }

    /// @notice Pays `receiver` everything claimed for it in `token` and not yet paid; anyone may
    ///         call it. Nothing to pay is not an error.
    function settle(address receiver, address token) external locked {
        ReceiverTotals storage totals = receivers[receiver][token];
        uint128 amount = totals.totalClaimed - totals.totalSettled;
        if (amount == 0) return;
        totals.totalSettled = totals.totalClaimed;
        sendTokens(token, receiver, amount);
        emit Settled(receiver, token, msg.sender, amount);
    }

    // ---------------------------------------------------------------- the payer's timed withdrawal

    /// @notice Starts a withdrawal of up to `amount` of the channel's unclaimed escrow; the payer or
    ///         its payer authorizer may call it, one at a time per channel.
    function initiateWithdraw(ChannelConfig calldata config, uint128 amount) external locked {
        if (msg.sender != config.payer && msg.sender != config.payerAuthorizer) revert NotAuthorizedToWithdraw();
        if (amount == 0) revert NothingToWithdraw();
        bytes32 channelId = getChannelId(config);
        PendingWithdrawal storage pending = pendingWithdrawals[channelId];
        if (pending.initiatedAt != 0) revert WithdrawalAlreadyPending();
        ChannelState storage channel = channels[channelId];
        if (amount > channel.balance - channel.totalClaimed) revert WithdrawAmountExceedsAvailable();

        pending.amount = amount;
        pending.initiatedAt = uint40(block.timestamp);
        emit WithdrawInitiated(channelId, amount, uint40(block.timestamp) + config.withdrawDelay);
    }

    /// @notice Completes a pending withdrawal once the channel's withdraw delay has passed: pays the
    ///         payer the pending amount, capped at what is still unclaimed now.
    function finalizeWithdraw(ChannelConfig calldata config) external locked {
        if (msg.sender != config.payer && msg.sender != config.payerAuthorizer) revert NotAuthorizedToWithdraw();
        bytes32 channelId = getChannelId(config);
        PendingWithdrawal storage pending = pendingWithdrawals[channelId];
        if (pending.initiatedAt == 0) revert WithdrawalNotPending();
        if (block.timestamp < uint256(pending.initiatedAt) + config.withdrawDelay) revert WithdrawDelayNotElapsed();

        ChannelState storage channel = channels[channelId];
        uint128 unclaimed = channel.balance - channel.totalClaimed;
        uint128 amount = pending.amount < unclaimed ? pending.amount : unclaimed;
        delete pendingWithdrawals[channelId];
        channel.balance -= amount;
        emit WithdrawFinalized(channelId, msg.sender, amount);
        if (channel.balance == 0 && channel.totalClaimed == 0) emit ChannelClosed(channelId, config);
        if (amount > 0) sendTokens(config.token, config.payer, amount);
    }

    // ---------------------------------------------------------------- cooperative refunds

    /// @notice Returns up to `amount` of the unclaimed escrow to the payer; the receiver or the
    ///         receiver authorizer may call it.
    function refund(ChannelConfig calldata config, uint128 amount) external locked {
        if (msg.sender != config.receiver && msg.sender != config.receiverAuthorizer) revert NotAuthorizedToRefund();
        applyRefund(config, amount);
    }

    /// @notice Like `refund`, authorized by the receiver authorizer's EIP-712 `Refund` signature over
    ///         the channel, the current refund nonce and `amount`; anyone may submit it.
    function refundWithSignature(
        ChannelConfig calldata config,
        uint128 amount,
        uint256 nonce,
        bytes calldata receiverAuthorizerSignature
    ) external locked {
        bytes32 channelId = getChannelId(config);
        if (nonce != refundNonce[channelId]) revert InvalidRefundNonce();
        if (!isValidSignatureNow(
                config.receiverAuthorizer, getRefundDigest(channelId, nonce, amount), receiverAuthorizerSignature
            )) revert InvalidSignature();
        applyRefund(config, amount);
    }

    // ---------------------------------------------------------------- EIP-712 views

    /// @notice The channel id of `config`: its EIP-712 hash under this contract's domain, so the same
    ///         config has another id on another chain or at another address.
    function getChannelId(ChannelConfig calldata config) public view returns (bytes32) {
        return typedDataHash(keccak256(abi.encode(CHANNEL_CONFIG_TYPEHASH, config)));
    }

    /// @notice The digest the payer (authorizer) signs for a voucher.
    function getVoucherDigest(bytes32 channelId, uint128 maxClaimableAmount) public view returns (bytes32) {
        return typedDataHash(keccak256(abi.encode(VOUCHER_TYPEHASH, channelId, maxClaimableAmount)));
    }

    /// @notice The digest the receiver authorizer signs for `refundWithSignature`.
    function getRefundDigest(bytes32 channelId, uint256 nonce, uint128 amount) public view returns (bytes32) {
        return typedDataHash(keccak256(abi.encode(REFUND_TYPEHASH, channelId, nonce, amount)));
    }

    /// @notice The digest the receiver authorizer signs for `claimWithSignature`: a `ClaimBatch` of one
    ///         `ClaimEntry(channelId, maxClaimableAmount, totalClaimed)` per row, in order.
    function getClaimBatchDigest(VoucherClaim[] calldata voucherClaims) public view returns (bytes32) {
        bytes32[] memory entries = new bytes32[](voucherClaims.length);
        for (uint256 i = 0; i < voucherClaims.length; i++) {
            VoucherClaim calldata row = voucherClaims[i];
            entries[i] = keccak256(
                abi.encode(
                    CLAIM_ENTRY_TYPEHASH, getChannelId(row.voucher.channel), row.voucher.maxClaimableAmount, row.totalClaimed
                )
            );
        }
        return typedDataHash(keccak256(abi.encode(CLAIM_BATCH_TYPEHASH, keccak256(abi.encodePacked(entries)))));
    }

    function DOMAIN_SEPARATOR() public view returns (bytes32) {
        return keccak256(
            abi.encode(
                DOMAIN_TYPEHASH, keccak256(bytes(DOMAIN_NAME)), keccak256(bytes(DOMAIN_VERSION)), block.chainid, address(this)
            )
        );
    }

    /// @notice EIP-5267: the fields of this contract's EIP-712 domain.
    function eip712Domain()
        external
        view
        returns (
            bytes1 fields,
            string memory name,
            string memory version,
            uint256 chainId,
            address verifyingContract,
            bytes32 salt,
            uint256[] memory extensions
        )
    {
        return (hex"0f", DOMAIN_NAME, DOMAIN_VERSION, block.chainid, address(this), bytes32(0), new uint256[](0));
    }

    // ---------------------------------------------------------------- internals

    /// @dev A row at or below what the channel already has claimed changes nothing (a replayed or
    ///      superseded voucher); above it, the row must stay within its voucher's ceiling and the
    ///      channel's balance, and the voucher must be signed by the payer authorizer (ECDSA only)
    ///      or, when that is zero, by the payer (ECDSA, or ERC-1271 for a contract).
    function applyClaim(VoucherClaim calldata row) private {
        ChannelConfig calldata config = row.voucher.channel;
        bytes32 channelId = getChannelId(config);
        ChannelState storage channel = channels[channelId];
        if (row.totalClaimed <= channel.totalClaimed) return;
        if (row.totalClaimed > row.voucher.maxClaimableAmount) revert ClaimExceedsCeiling();
        if (row.totalClaimed > channel.balance) revert ClaimExceedsBalance();

        bytes32 digest = getVoucherDigest(channelId, row.voucher.maxClaimableAmount);
        bool signed = config.payerAuthorizer != address(0)
            ? recoverSigner(digest, row.signature) == config.payerAuthorizer
            : isValidSignatureNow(config.payer, digest, row.signature);
        if (!signed) revert InvalidSignature();

        uint128 delta = row.totalClaimed - channel.totalClaimed;
        channel.totalClaimed = row.totalClaimed;
        receivers[config.receiver][config.token].totalClaimed += delta;
        emit Claimed(channelId, msg.sender, delta, row.totalClaimed);
    }

    /// @dev Advances the refund nonce first (so a refund that finds nothing unclaimed still uses it
    ///      up), then pays the payer `amount` capped at the unclaimed escrow, shrinking (or ending) a
    ///      pending withdrawal by what was refunded.
    function applyRefund(ChannelConfig calldata config, uint128 amount) private {
        if (amount == 0) revert ZeroRefund();
        bytes32 channelId = getChannelId(config);
        refundNonce[channelId] += 1;

        ChannelState storage channel = channels[channelId];
        uint128 unclaimed = channel.balance - channel.totalClaimed;
        uint128 refunded = amount < unclaimed ? amount : unclaimed;
        if (refunded == 0) return;
        channel.balance -= refunded;

        PendingWithdrawal storage pending = pendingWithdrawals[channelId];
        if (pending.initiatedAt != 0) {
            if (refunded >= pending.amount) {
                delete pendingWithdrawals[channelId];
            } else {
                pending.amount -= refunded;
            }
        }
        emit Refunded(channelId, msg.sender, refunded);
        if (channel.balance == 0 && channel.totalClaimed == 0) emit ChannelClosed(channelId, config);
        sendTokens(config.token, config.payer, refunded);
    }

    function typedDataHash(bytes32 structHash) private view returns (bytes32) {
        return keccak256(abi.encodePacked(hex"1901", DOMAIN_SEPARATOR(), structHash));
    }

    /// @dev ECDSA for an address without code, ERC-1271 for one with code (no ECDSA fallback then).
    function isValidSignatureNow(address signer, bytes32 digest, bytes calldata signature)
        private
        view
        returns (bool)
    {
        if (signer.code.length == 0) return signer != address(0) && recoverSigner(digest, signature) == signer;
        (bool ok, bytes memory answer) =
            signer.staticcall(abi.encodeWithSelector(ERC1271_MAGIC_VALUE, digest, signature));
        return ok && answer.length >= 32 && abi.decode(answer, (bytes32)) == bytes32(ERC1271_MAGIC_VALUE);
    }

    /// @dev The signer of a 65-byte (r, s, v) signature, or zero when it is malformed, malleable
    ///      (high s) or recovers nothing.
    function recoverSigner(bytes32 digest, bytes calldata signature) private pure returns (address) {
        if (signature.length != 65) return address(0);
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        if (v < 27) v += 27;
        if (uint256(s) > HALF_CURVE_ORDER || (v != 27 && v != 28)) return address(0);
        return ecrecover(digest, v, r, s);
    }

    function tokenBalance(address token) private view returns (uint256) {
        (bool ok, bytes memory answer) = token.staticcall(abi.encodeWithSelector(0x70a08231, address(this)));
        if (!ok || answer.length < 32) revert DepositCollectionFailed();
        return abi.decode(answer, (uint256));
    }

    /// @dev ERC-20 `transfer` that accepts tokens returning nothing and refuses a `false` answer.
    function sendTokens(address token, address to, uint128 amount) private {
        (bool ok, bytes memory answer) = token.call(abi.encodeWithSelector(0xa9059cbb, to, uint256(amount)));
        if (!ok || (answer.length != 0 && !abi.decode(answer, (bool))) || token.code.length == 0) {
            revert TransferFailed();
        }
    }
}
