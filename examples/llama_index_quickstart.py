"""LlamaIndex on Teola in one line: the README's example on the bundled SQuAD passages.

    python examples/llama_index_quickstart.py [--passages 30] [--question "..."]

Builds a plain LlamaIndex app (VectorStoreIndex + as_query_engine) whose LLM and embedding
model are Teola's (TeolaLLM, TeolaEmbedding on the runtime's vLLM and sentence-transformers
engines), sets ``Settings.executor = TeolaExecutor()`` and queries it: the query is traced into
primitives, optimized and scheduled. Prints the answer, its sources, what stayed opaque,
and the same query answered by plain LlamaIndex on the same engines.
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

    from llama_index.core import Document, Settings, VectorStoreIndex

    from teola_plugin import TeolaEmbedding, TeolaExecutor, TeolaLLM, datasets

    passages = datasets.load_corpus("squad-xquad-en")[: args.passages]
    question = args.question or datasets.load_questions("squad-xquad-en", limit=1)[0].question
    docs = [Document(text=p.text, metadata={"title": p.title}, id_=p.id) for p in passages]

    Settings.llm = TeolaLLM(max_tokens=args.max_tokens)  # on the default runtime's vLLM engine
    Settings.embed_model = TeolaEmbedding()  # its sentence-transformers engine
    Settings.executor = TeolaExecutor()  # the one line: query engines now run on Teola

    index = VectorStoreIndex.from_documents(docs)
    query_engine = index.as_query_engine(similarity_top_k=3)

    start = time.perf_counter()
    response = query_engine.query(question)
    teola_s = time.perf_counter() - start
    print(f"Q: {question}\nA (Teola, {teola_s:.2f} s): {response.response.strip()}")
    for source in response.source_nodes:
        print(f"   source {source.node.ref_doc_id}  score {source.score:.3f}")
    opaque = Settings.executor.traced(query_engine).opaque
    print("opaque components:", ", ".join(str(n) for n in opaque) or "none")

    Settings.executor = None  # plain LlamaIndex again, same engines
    start = time.perf_counter()
    plain = query_engine.query(question)
    print(f"A (plain LlamaIndex, {time.perf_counter() - start:.2f} s): {plain.response.strip()}")
    print("same answer:", plain.response == response.response)


if __name__ == "__main__":  # vLLM spawns processes: the guard is required
    main()
