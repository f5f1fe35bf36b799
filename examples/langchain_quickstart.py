"""LangChain on Teola: the README's example (wrap the chain) on the bundled SQuAD passages.

    python examples/langchain_quickstart.py [--passages 30] [--question "..."]

Builds an ordinary LCEL RAG chain whose models are Teola's (TeolaChatModel, TeolaEmbeddings
on the runtime's vLLM and sentence-transformers engines) over a LangChain InMemoryVectorStore,
wraps it in ``TeolaRunnable`` and runs it: traced into primitives, optimized, scheduled.
Prints the optimizer's explanation, the Teola answer next to plain LangChain's on the same
engines, a streamed answer, and a small batch.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=30, help="bundled passages to index")
    parser.add_argument("--question", default=None, help="default: the first bundled question")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()

    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough
    from langchain_core.vectorstores import InMemoryVectorStore

    from teola_plugin import datasets
    from teola_plugin.langchain import TeolaChatModel, TeolaEmbeddings, TeolaRunnable
    from teola_plugin.runtime.runtime import default_runtime

    passages = datasets.load_corpus("squad-xquad-en")[: args.passages]
    questions = [q.question for q in datasets.load_questions("squad-xquad-en", limit=4)]
    question = args.question or questions[0]

    store = InMemoryVectorStore(TeolaEmbeddings())  # on the default runtime's embedder engine
    store.add_texts([p.text for p in passages], metadatas=[{"title": p.title} for p in passages],
                    ids=[p.id for p in passages])
    retriever = store.as_retriever(search_kwargs={"k": 3})

    def format_docs(docs):
        return "\n\n".join(d.page_content for d in docs)

    prompt = ChatPromptTemplate.from_template(
        "Answer the question using only the context below, in one sentence.\n\n"
        "Context:\n{context}\n\nQuestion: {question}")
    chain = ({"context": retriever | format_docs, "question": RunnablePassthrough()}
             | prompt | TeolaChatModel(max_tokens=args.max_tokens) | StrOutputParser())

    fast = TeolaRunnable(chain)  # the one line
    print(fast.explain())

    start = time.perf_counter()
    answer = fast.invoke(question)
    print(f"Q: {question}\nA (Teola, {time.perf_counter() - start:.2f} s): {answer.strip()}")
    start = time.perf_counter()
    plain = chain.invoke(question)
    print(f"A (plain LangChain, {time.perf_counter() - start:.2f} s): {plain.strip()}")
    print("same answer:", plain == answer)

    print("streamed: ", end="", flush=True)
    for chunk in fast.stream(question):
        print(chunk, end="", flush=True)
    print()
    for q, a in zip(questions, fast.batch(questions)):
        print(f"batch: {q} -> {a.strip()}")
    default_runtime().shutdown()


if __name__ == "__main__":  # vLLM spawns processes: the guard is required
    main()
