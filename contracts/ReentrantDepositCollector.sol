// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @title ReentrantDepositCollector — an attacker's deposit collector, for the batch-settlement tests.
/// @notice When X402BatchSettlement asks it to collect, it instead makes one call it was armed
///         with (e.g. a genuine deposit into another channel), hoping that the tokens of that call
///         also count as the outer deposit's: two channels credited, tokens paid in once. The
///         settlement contract's reentrancy lock must refuse it. Test fixture only; deployed by the
///         test that uses it, never installed on a chain by default.
contract ReentrantDepositCollector {
    address public target;
    bytes public armedCall;

    function arm(address target_, bytes calldata call_) external {
        target = target_;
        armedCall = call_;
    }

    function collect(address, address, uint128, bytes32, bytes calldata) external {
        (bool ok, bytes memory answer) = target.call(armedCall);
        if (!ok) {
            assembly ("memory-safe") {
                revert(add(answer, 0x20), mload(answer))
            }
        }
    }
}
