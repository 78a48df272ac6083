// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @title Multicall — the subset of Multicall3 that x402 facilitators use.
/// @notice Installed as runtime code at Multicall3's canonical address
///         (0xcA11bde05977b3631167028862bE2a173976CA11) on local test chains, where the official
///         x402 facilitator batches `authorizationState`, `name`, `version` and `balanceOf` reads
///         through it to name why a payment would fail. ABI-compatible with Multicall3 for
///         `aggregate3`, `tryAggregate` and `getBlockNumber`. Holds no storage, so code
///         copied with `anvil_setCode` works without running a constructor.
contract Multicall {
    struct Call {
        address target;
        bytes callData;
    }

    struct Call3 {
        address target;
        bool allowFailure;
        bytes callData;
    }

    struct Result {
        bool success;
        bytes returnData;
    }

    /// @notice Calls each target in order; reverts on the first failure whose `allowFailure` is false.
    function aggregate3(Call3[] calldata calls) external payable returns (Result[] memory results) {
        results = new Result[](calls.length);
        for (uint256 i = 0; i < calls.length; i++) {
            (bool ok, bytes memory data) = calls[i].target.call(calls[i].callData);
            require(ok || calls[i].allowFailure, "Multicall: call failed");
            results[i] = Result(ok, data);
        }
    }

    /// @notice Calls each target in order; with `requireSuccess` any failure reverts the batch.
    function tryAggregate(bool requireSuccess, Call[] calldata calls)
        external
        payable
        returns (Result[] memory results)
    {
        results = new Result[](calls.length);
        for (uint256 i = 0; i < calls.length; i++) {
            (bool ok, bytes memory data) = calls[i].target.call(calls[i].callData);
            require(ok || !requireSuccess, "Multicall: call failed");
            results[i] = Result(ok, data);
        }
    }

    function getBlockNumber() external view returns (uint256) {
        return block.number;
    }
}
