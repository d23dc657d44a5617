// The lifecycle checks: which calls each state allows, and the message of a refused one.
import Testing
import VMLayer

@Suite struct VMStateTests {
    @Test func whatEachStateAllows() {
        #expect(VMState.running.allows(VMOperation.dialAgent))
        #expect(VMState.running.allows(VMOperation.snapshot))
        #expect(VMState.running.allows(VMOperation.requestStop))
        #expect(!VMState.running.allows(VMOperation.cleanup))
        #expect(!VMState.booting.allows(VMOperation.dialAgent))
        #expect(VMState.booting.allows(VMOperation.kill))
        #expect(!VMState.stopping.allows(VMOperation.requestStop))
        #expect(!VMState.stopping.allows(VMOperation.snapshot))
        #expect(VMState.stopping.allows(VMOperation.kill))
        for gone in [VMState.exited("killed"), VMState.failed("no kernel")] {
            #expect(gone.isGone)
            #expect(gone.allows(VMOperation.cleanup))
            #expect(!gone.allows(VMOperation.kill))
            #expect(!gone.allows(VMOperation.dialAgent))
        }
    }

    @Test func aRefusedCallNamesTheOperationAndTheState() {
        #expect(throws: LayerFailure.failed("vm v is gone (killed): cannot snapshot the writable layer")) {
            try VMState.exited("killed").check(VMOperation.snapshot, id: "v")
        }
        #expect(throws: LayerFailure.failed("vm v is booting: cannot dial the agent")) {
            try VMState.booting.check(VMOperation.dialAgent, id: "v")
        }
    }
}
